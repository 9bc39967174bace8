"""PostgreSQL: a short pending list for the facts' trigram index.

A GIN index takes new rows into a pending list that every search reads in full until the list
passes gin_pending_list_limit (4 MB by default) or vacuum merges it. Facts are written one at a
time and searched often: after 2,000 writes a 4 MB list made searches 20% slower (724 vs 871 per
second over 100,000 facts, bench/README.md); 128 kB keeps writes batched into the index and what
a search reads short. SQLite's FTS5 index has its own delta (migration 0007).
"""

from django.db import migrations


INDEX = "memory_fact_search_trgm"


def cap_pending_list(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER INDEX {INDEX} SET (gin_pending_list_limit = 128)")


def restore_pending_list(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER INDEX {INDEX} RESET (gin_pending_list_limit)")


class Migration(migrations.Migration):
    dependencies = [("memory", "0015_memory_relation")]

    operations = [migrations.RunPython(cap_pending_list, restore_pending_list)]
