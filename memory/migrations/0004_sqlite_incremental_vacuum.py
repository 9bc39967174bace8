"""SQLite: switch the database file to auto_vacuum=INCREMENTAL, so pruning can give pages back.

Once a file has a table (or is in WAL mode) its mode changes only with a full VACUUM, run here once:
instant on a new file, which has only the tables of the migrations before this one. Not in the
connection's init command: `PRAGMA auto_vacuum = INCREMENTAL` takes the write lock even when the mode
is already set, so every new connection would wait for the writer of the moment. VACUUM cannot run
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
