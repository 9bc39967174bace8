"""System checks of the workflows app (`manage.py check`, and every server start)."""

from django.core.checks import Error, Tags, register
from django.core.exceptions import ImproperlyConfigured

from .conf import workflow_settings
from .conversations.checkpointer import checkpoint_path, checkpointer_kind
from .graph.triggers import SHARED_SENDER_MODES


@register(Tags.compatibility)
def telegram_needs_a_bot_token(app_configs, **kwargs):
    """A webhook secret without a bot token accepts updates it can never answer."""
    if workflow_settings.TELEGRAM_WEBHOOK_SECRET and not workflow_settings.TELEGRAM_BOT_TOKEN:
        return [
            Error(
                "WORKFLOWS['TELEGRAM_WEBHOOK_SECRET'] is set but WORKFLOWS['TELEGRAM_BOT_TOKEN'] is not: "
                "Telegram updates would run but no reply could be sent.",
                hint="Set TELEGRAM_BOT_TOKEN (the environment variable the settings read), or unset the secret.",
                id="workflows.E001",
            )
        ]
    return []


@register(Tags.compatibility)
def sqlite_checkpoints_have_a_place(app_configs, **kwargs):
    """SQLite checkpoints need a file: WORKFLOWS['CHECKPOINT_PATH'], or data/ under the project's BASE_DIR."""
    try:
        if checkpointer_kind() == "sqlite":
            checkpoint_path()
    except (ImproperlyConfigured, ValueError) as exc:
        return [Error(str(exc), id="workflows.E002")]
    return []


@register(Tags.compatibility)
def telegram_shared_senders_mode(app_configs, **kwargs):
    """TELEGRAM_SHARED_SENDERS decides who a message of a shared sender runs as: it must be a known mode."""
    mode = workflow_settings.TELEGRAM_SHARED_SENDERS
    if mode not in SHARED_SENDER_MODES:
        return [
            Error(
                f"WORKFLOWS['TELEGRAM_SHARED_SENDERS'] must be one of {', '.join(SHARED_SENDER_MODES)}, got {mode!r}",
                id="workflows.E003",
            )
        ]
    return []
