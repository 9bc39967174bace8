"""Valid time: when a fact holds in the world (Fact.valid_from / valid_to), apart from when it was
recorded; fact history keeps each version's valid time (FactVersion.world_from / world_to, whose
`valid_from` already names the version's recorded start; recorded_world_to, the end it had before a
later value closed it) and the view memory_fact_history shows it.

The columns are added with ALTER TABLE ... ADD COLUMN (as in 0017), not Django's AddField, which on
SQLite would rebuild memory_fact and drop the triggers of its indexes. The view is made again with
the new columns.
"""

from importlib import import_module

from django.db import migrations, models

# The view as 0017 made it (its columns and its current-version select), to make it again.
before = import_module("memory.migrations.0017_fact_current_version")

FACT, VERSION, VIEW = "memory_fact", "memory_fact_version", "memory_fact_history"
COLUMNS = (
    (FACT, "valid_from"),
    (FACT, "valid_to"),
    (VERSION, "world_from"),
    (VERSION, "world_to"),
    (VERSION, "recorded_world_to"),
)

CREATE_VIEW = (
    f'CREATE VIEW {VIEW} (id, {before._COLUMNS}, "current", world_from, world_to, recorded_world_to) AS '
    f"SELECT v.id, {', '.join('v.' + c.strip() for c in before._COLUMNS.split(','))}, FALSE, "
    f"v.world_from, v.world_to, v.recorded_world_to FROM {VERSION} v "
    f"UNION ALL SELECT -f.id, {before.CURRENT_VERSION}, TRUE, f.valid_from, f.valid_to, f.valid_to FROM {FACT} f"
)


def add_columns(apps, schema_editor):
    kind = models.DateTimeField(null=True).db_type(schema_editor.connection)
    for table, column in COLUMNS:
        schema_editor.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind} NULL")


def drop_columns(apps, schema_editor):
    for table, column in reversed(COLUMNS):
        schema_editor.execute(f"ALTER TABLE {table} DROP COLUMN {column}")


def nullable_time():
    return models.DateTimeField(blank=True, null=True)


class Migration(migrations.Migration):
    dependencies = [("memory", "0021_erasure_tombstone")]

    operations = [
        migrations.RunSQL(before.DROP_VIEW, before.CREATE_VIEW),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(add_columns, drop_columns)],
            state_operations=[
                migrations.AddField(model_name="fact", name="valid_from", field=nullable_time()),
                migrations.AddField(model_name="fact", name="valid_to", field=nullable_time()),
                migrations.AddField(model_name="factversion", name="world_from", field=nullable_time()),
                migrations.AddField(model_name="factversion", name="world_to", field=nullable_time()),
                migrations.AddField(model_name="factversion", name="recorded_world_to", field=nullable_time()),
                migrations.AddField(model_name="facthistory", name="world_from", field=nullable_time()),
                migrations.AddField(model_name="facthistory", name="world_to", field=nullable_time()),
                migrations.AddField(model_name="facthistory", name="recorded_world_to", field=nullable_time()),
            ],
        ),
        migrations.RunSQL(CREATE_VIEW, before.DROP_VIEW),
    ]
