"""Workspaces: workflows and conversation threads belong to one (memory migration 0030); existing
rows to the default workspace. SQLite adds the column without rebuilding the table (see 0030)."""

import importlib

from django.db import migrations

AddWorkspaceField = importlib.import_module("memory.migrations.0030_workspaces").AddWorkspaceField


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0030_workspaces"),
        ("workflows", "0007_reminder_thread"),
    ]

    operations = [
        AddWorkspaceField("workflow", "workflows"),
        AddWorkspaceField("thread", "threads"),
    ]
