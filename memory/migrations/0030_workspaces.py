"""Workspaces (tenants): the Workspace and WorkspaceMember tables, the default workspace, and a
`workspace` column on memory users, channel identities, episodes, facts, procedures, store items
and teams.

Every row that exists before this migration belongs to the default workspace (row 1,
memory.models.workspaces.DEFAULT_WORKSPACE_ID): the new column's default while it is added.

SQLite: the column is added with ALTER TABLE ... ADD COLUMN rather than Django's rebuild of the
table, which would drop the recall and search triggers (migrations 0002, 0006, ...) and the raw
indexes of those tables. SQLite cannot add a column with both a REFERENCES clause and a non-NULL
default, nor drop one that has it, so on SQLite the column is a plain indexed integer (the ORM still
protects a workspace that has rows); PostgreSQL gets the foreign key. The column keeps DEFAULT 1 in
SQLite's schema; Django always writes it.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

import memory.models.workspaces

DEFAULT_WORKSPACE_ID = 1  # a frozen copy of memory.models.workspaces.DEFAULT_WORKSPACE_ID


def create_default_workspace(apps, schema_editor):
    Workspace = apps.get_model("memory", "Workspace")
    workspace = Workspace.objects.create(slug="default", name="Default workspace")
    if workspace.pk != DEFAULT_WORKSPACE_ID:
        raise RuntimeError(f"the default workspace must be row {DEFAULT_WORKSPACE_ID}, got {workspace.pk}")


class AddWorkspaceField(migrations.AddField):
    """AddField of the `workspace` foreign key; on SQLite an ALTER TABLE, never a rebuild of the table."""

    def __init__(self, model_name, related_name):
        super().__init__(
            model_name=model_name,
            name="workspace",
            field=models.ForeignKey(
                default=memory.models.workspaces.workspace_default,
                editable=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name=related_name,
                to="memory.workspace",
            ),
        )

    def deconstruct(self):
        return (
            self.__class__.__name__,
            [],
            {"model_name": self.model_name, "related_name": self.field.remote_field.related_name},
        )

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "sqlite":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        table = to_state.apps.get_model(app_label, self.model_name)._meta.db_table
        schema_editor.execute(
            f'ALTER TABLE "{table}" ADD COLUMN "workspace_id" bigint NOT NULL DEFAULT {DEFAULT_WORKSPACE_ID}'
        )
        schema_editor.execute(f'CREATE INDEX "{table}_workspace_id" ON "{table}" ("workspace_id")')

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "sqlite":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        table = from_state.apps.get_model(app_label, self.model_name)._meta.db_table
        schema_editor.execute(f'DROP INDEX "{table}_workspace_id"')
        schema_editor.execute(f'ALTER TABLE "{table}" DROP COLUMN "workspace_id"')


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0029_team_scope"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="Workspace",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("slug", models.SlugField(max_length=100, unique=True)),
                ("name", models.CharField(blank=True, default="", max_length=200)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={"ordering": ["slug"]},
        ),
        migrations.RunPython(create_default_workspace, migrations.RunPython.noop),
        AddWorkspaceField("memoryuser", "memory_users"),
        AddWorkspaceField("channelidentity", "channel_identities"),
        AddWorkspaceField("episode", "episodes"),
        AddWorkspaceField("fact", "facts"),
        AddWorkspaceField("procedure", "procedures"),
        AddWorkspaceField("storeitem", "store_items"),
        AddWorkspaceField("team", "teams"),
        migrations.CreateModel(
            name="WorkspaceMember",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "user",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="engram_workspace",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "workspace",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="members", to="memory.workspace"
                    ),
                ),
            ],
            options={"db_table": "memory_workspace_member"},
        ),
    ]
