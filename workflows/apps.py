"""App configuration of the workflows app."""

from django.apps import AppConfig


class WorkflowsConfig(AppConfig):
    name = "workflows"
    verbose_name = "Workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import (
            checks,  # noqa: F401  (system checks: a webhook secret needs a bot token)
            conf,  # noqa: F401  (reloads settings on override)
            lifecycle,
            nodes,  # noqa: F401  (registers the built-in node types)
            outbox,  # noqa: F401  (receiver: users_deleting deletes replies not yet sent)
            reminders,  # noqa: F401  (receivers: users_deleting, users_merged, footprint, export)
            runs,  # noqa: F401  (receivers: users_deleting, users_merged, footprint, export, prune)
            threads,  # noqa: F401  (receivers: users_deleting, users_merged, Thread deletes)
        )
        from .management import subcommands

        lifecycle.connect()  # `memory prune` trims threads; /healthz checks the checkpointer
        subcommands.register()  # `memory reminders`
