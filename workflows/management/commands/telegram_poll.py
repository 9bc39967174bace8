"""Serve a workflow from Telegram with getUpdates: development without a public webhook URL.

Telegram delivers updates either to a webhook or to getUpdates, not both: remove the bot's webhook
(Bot API deleteWebhook) before polling.
"""

import logging

from django.core.management.base import BaseCommand, CommandError
from rich.console import Console

from workflows.channels.telegram import get_bot_api, handle_update
from workflows.conf import workflow_settings
from workflows.exceptions import InvalidTrigger, TelegramError
from workflows.graph.runtime import WorkflowNotFound, get_workflow

logger = logging.getLogger("engram.workflows")


class Command(BaseCommand):
    help = "Poll Telegram's getUpdates and run a workflow for each update (Ctrl-C stops)."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--once", action="store_true", help="handle one batch of updates, then stop")
        parser.add_argument("--timeout", type=int, default=None, help="long-poll seconds (default: setting)")

    def handle(self, *args, slug, once, timeout, **options):
        console = Console(file=self.stdout, highlight=False)
        try:
            workflow = get_workflow(slug)
            bot = get_bot_api()
        except (WorkflowNotFound, TelegramError) as exc:
            raise CommandError(str(exc)) from None
        timeout = workflow_settings.TELEGRAM_POLL_TIMEOUT if timeout is None else timeout
        offset = None
        console.print(f"polling Telegram for workflow [bold]{workflow.slug}[/] (Ctrl-C stops)")
        try:
            while True:
                try:
                    updates = bot.get_updates(offset=offset, timeout=0 if once else timeout) or []
                except TelegramError as exc:
                    if once:
                        raise CommandError(str(exc)) from None
                    logger.error("getUpdates failed: %s", exc)
                    continue
                for update in updates:
                    update_id = update.get("update_id") if isinstance(update, dict) else None
                    if isinstance(update_id, bool) or not isinstance(update_id, int):
                        logger.error("getUpdates returned an update without an integer update_id; skipped")
                        continue
                    offset = max(offset or 0, update_id + 1)
                    try:
                        outcome = handle_update(workflow, update, bot=bot)
                    except InvalidTrigger as exc:
                        console.print(f"update {update_id}: [red]bad update[/] {exc}")
                        continue
                    console.print(
                        f"update {update_id}: {outcome.status}" + (" (reply sent)" if outcome.reply_sent else "")
                    )
                if once:
                    if offset is not None:
                        bot.get_updates(offset=offset, timeout=0)  # confirm what was handled
                    return
        except KeyboardInterrupt:
            console.print("stopped")
