"""Fact versions carry their workspace: memory_fact_version takes a `workspace` column and the view
memory_fact_history (FactHistory) shows it, for the point-in-time reads (as_of, valid_at) to keep to
the current workspace in their own SQL. Agent, session and global owner keys are the same text in
every workspace, so without it another workspace's past versions under a shared owner could be read.

Backfill: a version takes its fact's workspace. A version whose fact is deleted (the fact row is gone)
takes its person's workspace, else its team's, else that of the episode it came from, else the
default workspace: before this migration no `deleted` version said which workspace deleted it, and
every row that existed before workspaces (migration 0030) is the default workspace's. From here on
every version, the `deleted` one included, is copied with its fact's workspace
(memory.backends.base.version_copy_sql).

The column is added as migration 0030 adds it (on SQLite an ALTER TABLE, a plain indexed integer;
on PostgreSQL a foreign key); the view is dropped first and made again with the column.
"""

from importlib import import_module

from django.db import migrations, models

workspaces = import_module("memory.migrations.0030_workspaces")
view = import_module("memory.migrations.0022_valid_time")
before = view.before  # 0017: the view's columns and its current-version select

FACT, VERSION, VIEW = "memory_fact", "memory_fact_version", "memory_fact_history"

CREATE_VIEW = (
    f'CREATE VIEW {VIEW} (id, {before._COLUMNS}, "current", world_from, world_to, recorded_world_to, workspace_id) '
    f"AS SELECT v.id, {', '.join('v.' + c.strip() for c in before._COLUMNS.split(','))}, FALSE, "
    f"v.world_from, v.world_to, v.recorded_world_to, v.workspace_id FROM {VERSION} v "
    f"UNION ALL SELECT -f.id, {before.CURRENT_VERSION}, TRUE, f.valid_from, f.valid_to, f.valid_to, f.workspace_id "
    f"FROM {FACT} f"
)

_OF = f"{VERSION}.{{}}"
BACKFILL = (
    f"UPDATE {VERSION} SET workspace_id = COALESCE("
    f"(SELECT f.workspace_id FROM {FACT} f WHERE f.id = {_OF.format('fact_id')}), "
    f"(SELECT u.workspace_id FROM memory_memoryuser u WHERE u.id = {_OF.format('user_id')}), "
    f"(SELECT t.workspace_id FROM memory_team t WHERE t.id = {_OF.format('team_id')}), "
    f"(SELECT e.workspace_id FROM memory_episode e WHERE e.id = {_OF.format('source_episode_id')}), "
    f"{workspaces.DEFAULT_WORKSPACE_ID})"
)


class Migration(migrations.Migration):
    dependencies = [("memory", "0031_workspace_unique_keys")]

    operations = [
        migrations.RunSQL(before.DROP_VIEW, view.CREATE_VIEW),
        workspaces.AddWorkspaceField("factversion", "fact_versions"),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="facthistory",
                    name="workspace",
                    field=models.ForeignKey(
                        db_constraint=False,
                        editable=False,
                        on_delete=models.deletion.DO_NOTHING,
                        related_name="+",
                        to="memory.workspace",
                    ),
                ),
            ],
        ),
        migrations.RunSQL(CREATE_VIEW, before.DROP_VIEW),
    ]
