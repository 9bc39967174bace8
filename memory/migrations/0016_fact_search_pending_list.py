"""PostgreSQL: a short pending list for the facts' trigram index.

A GIN index takes new rows into a pending list that every search reads in full until the list
passes gin_pending_list_limit (4 MB by default) or vacuum merges it. Facts are written one at a
time and searched often: after 2,000 writes a 4 MB list made searches 20% slower (724 vs 871 per
second over 100,000 facts, bench/README.md); 128 kB keeps writes batched into the index and what
a search reads short. SQLite's FTS5 index has its own delta (migration 0007).
"""

from django.db import migrations


def run_for_vendor(statements):
    def run(apps, schema_editor):
        for sql in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("memory", "0015_memory_relation")]

    operations = [
        migrations.RunPython(
            run_for_vendor({"postgresql": ["ALTER INDEX memory_fact_search_trgm SET (gin_pending_list_limit = 128)"]}),
            run_for_vendor({"postgresql": ["ALTER INDEX memory_fact_search_trgm RESET (gin_pending_list_limit)"]}),
        ),
    ]
