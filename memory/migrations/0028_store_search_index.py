"""SQLite: a covering index of the store's items by namespace, so a search under a namespace never reads the table.

A filtered search (EngramStore.search(prefix, filter=...)) reads every item under the prefix to test
the filter (json_extract on `value`) and sort them by updated_at. Through the (namespace, key) unique
index each of those items cost a lookup of its table row, and a row that holds a vector (1.5 KB with
the local model) shares its page with one other row: 1,000 searches over 100 items each looked up
100,000 rows scattered over the file. This index holds every column such a search reads (the rowid is
the id), in namespace order, so the items under a prefix are a few adjacent index pages: 2.5-3x the
statement's rate in `python -m bench.store`'s workload. Values are stored twice (the index's share
of the file); the vectors and the search text are not in it. Deleted entries are overwritten like rows (secure_delete).

PostgreSQL is left alone: a btree entry cannot exceed about 2.7 KB, which a value may, and its
filtered search goes through jsonb containment on the table.
"""

from django.db import migrations

NAME = "memory_store_item_under"


def covering_index(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(
            f"CREATE INDEX {NAME} ON memory_store_item "
            "(namespace, key, expires_at, updated_at, created_at, ttl_minutes, value)"
        )


def no_covering_index(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(f"DROP INDEX {NAME}")


class Migration(migrations.Migration):
    dependencies = [("memory", "0027_concepts")]

    operations = [migrations.RunPython(covering_index, no_covering_index)]
