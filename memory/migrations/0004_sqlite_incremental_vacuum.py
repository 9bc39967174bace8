"""SQLite: switch the database file to auto_vacuum=INCREMENTAL, so pruning can give pages back.

A new file gets the mode from the connection's init command (it must be set before the first table
exists); an existing file only changes mode with a full VACUUM, run here once. VACUUM cannot run
inside a transaction, hence a non-atomic migration. PostgreSQL needs nothing: autovacuum reclaims
space on its own.
"""

from django.db import migrations

INCREMENTAL = 2  # PRAGMA auto_vacuum reports 0 none, 1 full, 2 incremental


def to_incremental(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "sqlite":
        return
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA auto_vacuum")
        if cursor.fetchone()[0] == INCREMENTAL:
            return
        cursor.execute("PRAGMA auto_vacuum = INCREMENTAL")
        cursor.execute("VACUUM")


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("memory", "0003_consolidation_run")]

    operations = [migrations.RunPython(to_incremental, migrations.RunPython.noop)]
