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
        )
        from .channels import (
            outbox,  # noqa: F401  (receiver: users_deleting deletes replies not yet sent)
        )
        from .conversations import (
            reminders,  # noqa: F401  (receivers: users_deleting, users_merged, footprint, export)
            threads,  # noqa: F401  (receivers: users_deleting, users_merged, Thread deletes)
            upkeep,
        )
        from .graph import (
            runs,  # noqa: F401  (receivers: users_deleting, users_merged, footprint, export, prune)
        )
        from .language.registry import register_module
        from .management import subcommands

        register_module("workflows.graph.nodes")  # the built-in node types, on the registry's first read
        upkeep.connect()  # `memory prune` trims threads; /healthz checks the checkpointer
        subcommands.register()  # `memory reminders`
