"""Recall documents carry their item's workspace (memory_recall_doc.workspace_id), for recall's
candidate queries (keyword, vector, the visibility check and its shadowing) to keep to the current
workspace's documents: agent, session and global owners are the same text in every workspace, so
another workspace's documents under them took candidate places before they were dropped, and a
more specific one of theirs could shadow one of the viewer's.

The item triggers of migration 0006 (as 0019 and 0029 left them) write it when they insert a
document: the insert statement gains the column, nothing else changes, so a write costs no extra
statement. Items never change workspace, so the update triggers need not watch it. Existing
documents take their item's workspace. A plain integer with DEFAULT 1 (the default workspace), as
migration 0030 adds the items' columns on SQLite: no rebuild of the table and its triggers.
"""

from django.db import migrations, models

DOC = "memory_recall_doc"
ITEMS = {"fact": "memory_fact", "episode": "memory_episode", "procedure": "memory_procedure"}
DEFAULT_WORKSPACE_ID = 1  # a frozen copy of memory.models.workspaces.DEFAULT_WORKSPACE_ID

ADD_COLUMN = f"ALTER TABLE {DOC} ADD COLUMN workspace_id bigint NOT NULL DEFAULT {DEFAULT_WORKSPACE_ID}"
DROP_COLUMN = f"ALTER TABLE {DOC} DROP COLUMN workspace_id"
BACKFILL = [
    f"UPDATE {DOC} SET workspace_id = COALESCE((SELECT i.workspace_id FROM {table} i WHERE i.id = {DOC}.item_id), "
    f"{DEFAULT_WORKSPACE_ID}) WHERE kind = '{kind}'"
    for kind, table in ITEMS.items()
]


def _swaps(kind, new):
    """[(text without the workspace, text with it)] in an item trigger's document insert; `new`:
    the trigger's name for the inserted row (new on SQLite, NEW in plpgsql)."""
    return [
        (f"INSERT INTO {DOC} (kind, ", f"INSERT INTO {DOC} (workspace_id, kind, "),
        (f"VALUES ('{kind}', {new}.id, ", f"VALUES ({new}.workspace_id, '{kind}', {new}.id, "),
    ]


def _swapped(sql, kind, new, forwards):
    for without, with_ in _swaps(kind, new):
        old, replacement = (without, with_) if forwards else (with_, without)
        if sql.count(old) != 1:
            raise RuntimeError(f"the {kind} recall trigger does not insert its document as expected: {old!r}")
        sql = sql.replace(old, replacement)
    return sql


def rewrite_triggers(forwards):
    def run(apps, schema_editor):
        vendor = schema_editor.connection.vendor
        with schema_editor.connection.cursor() as cursor:
            for kind in ITEMS:
                if vendor == "sqlite":
                    name = f"memory_recall_{kind}_ai"
                    cursor.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = %s", [name])
                    sql = _swapped(cursor.fetchone()[0], kind, "new", forwards)
                    cursor.execute(f"DROP TRIGGER {name}")
                    cursor.execute(sql)
                elif vendor == "postgresql":
                    cursor.execute("SELECT pg_get_functiondef(%s::regprocedure)", [f"memory_recall_{kind}_sync()"])
                    # CREATE OR REPLACE: the trigger that calls it stays as it is.
                    cursor.execute(_swapped(cursor.fetchone()[0], kind, "NEW", forwards))

    return run


class Migration(migrations.Migration):
    dependencies = [("memory", "0032_workspace_fact_versions")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL([ADD_COLUMN, *BACKFILL], DROP_COLUMN)],
            state_operations=[
                migrations.AddField(
                    model_name="recalldocument",
                    name="workspace_id",
                    field=models.BigIntegerField(default=DEFAULT_WORKSPACE_ID, editable=False),
                ),
            ],
        ),
        migrations.RunPython(rewrite_triggers(forwards=True), rewrite_triggers(forwards=False)),
    ]
