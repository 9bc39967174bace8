"""Tags on facts (the remember tool's `tags`) and an operator's pin on facts and procedures.

Added with ALTER TABLE ... ADD COLUMN, not Django's AddField, which on SQLite would rebuild memory_fact
and drop the triggers of its indexes (as in 0017). JSON is text on SQLite, jsonb on PostgreSQL.
"""

from django.db import migrations, models


def _add(schema_editor, statements):
    for sql in statements:
        schema_editor.execute(sql)


def add_columns(apps, schema_editor):
    json_type = "jsonb" if schema_editor.connection.vendor == "postgresql" else "text"
    _add(
        schema_editor,
        [
            f"ALTER TABLE memory_fact ADD COLUMN tags {json_type} NOT NULL DEFAULT '[]'",
            "ALTER TABLE memory_fact ADD COLUMN pinned boolean NOT NULL DEFAULT FALSE",
            "ALTER TABLE memory_procedure ADD COLUMN pinned boolean NOT NULL DEFAULT FALSE",
        ],
    )


def drop_columns(apps, schema_editor):
    _add(
        schema_editor,
        [
            "ALTER TABLE memory_procedure DROP COLUMN pinned",
            "ALTER TABLE memory_fact DROP COLUMN pinned",
            "ALTER TABLE memory_fact DROP COLUMN tags",
        ],
    )


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0022_valid_time"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(add_columns, drop_columns)],
            state_operations=[
                migrations.AddField(model_name="fact", name="pinned", field=models.BooleanField(default=False)),
                migrations.AddField(model_name="fact", name="tags", field=models.JSONField(blank=True, default=list)),
                migrations.AddField(model_name="procedure", name="pinned", field=models.BooleanField(default=False)),
            ],
        ),
    ]
