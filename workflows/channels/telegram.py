"""Telegram: a small Bot API client, and the one handler webhook and polling both use.

The Bot API base URL, token and webhook secret come from WORKFLOWS settings (the token also from the
TELEGRAM_BOT_TOKEN environment variable). The token is part of every Bot API URL, so no URL, request
or client exception is ever logged or raised as is: errors are rebuilt without it.
"""

import logging
import re
import threading
from dataclasses import dataclass
from datetime import timedelta

import httpx
from django.db import IntegrityError, transaction
from django.utils import timezone

from ..conf import on_workflow_settings_changed, workflow_settings
from ..exceptions import TelegramError
from ..graph.runtime import RunResult, run_workflow
from ..graph.triggers import telegram_update_kind
from ..models import TelegramUpdate

logger = logging.getLogger("engram.workflows")

MAX_MESSAGE_LENGTH = 4096
_BOT_PATH = re.compile(r"/bot[^/\s\"']+/")


class RedactBotToken(logging.Filter):
    """Rewrites Bot API URLs in a log record (httpx logs each request's URL at INFO) to hide the token."""

    def filter(self, record):
        message = record.getMessage()
        if "/bot" in message:
            record.msg, record.args = _BOT_PATH.sub("/bot<token>/", message), ()
        return True


for _name in ("httpx", "httpcore"):
    logging.getLogger(_name).addFilter(RedactBotToken())


class BotAPI:
    """The Bot API methods Engram uses, over one pooled, thread-safe HTTP client."""

    def __init__(self, base_url, token, *, timeout=10.0):
        if not token:
            raise TelegramError("no bot token: set WORKFLOWS['TELEGRAM_BOT_TOKEN'] or TELEGRAM_BOT_TOKEN")
        self._base = f"{base_url.rstrip('/')}/bot{token}"
        self._token = token
        self._client = httpx.Client(timeout=timeout)

    def close(self):
        self._client.close()

    def call(self, method, payload, *, timeout=None):
        try:
            response = self._client.post(
                f"{self._base}/{method}", json=payload, timeout=timeout or httpx.USE_CLIENT_DEFAULT
            )
        except httpx.HTTPError as exc:
            # httpx puts the URL (with the token) into some messages: say what failed without it.
            raise TelegramError(f"{method}: {type(exc).__name__}: {self._redact(str(exc))}") from None
        try:
            body = response.json()
        except ValueError:
            raise TelegramError(f"{method}: HTTP {response.status_code}, not JSON") from None
        if response.status_code != 200 or not body.get("ok"):
            raise TelegramError(
                f"{method}: HTTP {response.status_code}: {self._redact(str(body.get('description', '')))}"
            )
        return body.get("result")

    def _redact(self, text):
        return text.replace(self._token, "<token>")

    def send_message(self, chat_id, text):
        return self.call("sendMessage", {"chat_id": chat_id, "text": text[:MAX_MESSAGE_LENGTH] or "…"})

    def answer_callback_query(self, callback_query_id):
        return self.call("answerCallbackQuery", {"callback_query_id": callback_query_id})

    def get_updates(self, offset=None, timeout=0):
        payload = {"timeout": timeout, "allowed_updates": ["message", "edited_message", "callback_query"]}
        if offset is not None:
            payload["offset"] = offset
        return self.call("getUpdates", payload, timeout=workflow_settings.TELEGRAM_TIMEOUT + timeout)


_lock = threading.Lock()
_bot = None


def get_bot_api():
    """The process's shared Bot API client, from settings."""
    global _bot
    if _bot is None:
        with _lock:
            if _bot is None:
                _bot = BotAPI(
                    workflow_settings.TELEGRAM_API_BASE,
                    workflow_settings.TELEGRAM_BOT_TOKEN,
                    timeout=workflow_settings.TELEGRAM_TIMEOUT,
                )
    return _bot


def reset_bot_api():
    global _bot
    with _lock:
        bot, _bot = _bot, None
    if bot is not None:
        bot.close()


@dataclass
class UpdateOutcome:
    """What happened to one update: ran (with its result), a duplicate, or not handled."""

    status: str  # "ran", "duplicate", "ignored"
    result: RunResult | None = None
    reply_sent: bool = False
    reply_error: str = ""

    def as_dict(self):
        data = {"ok": True, "status": self.status}
        if self.result is not None:
            data.update(
                reply_sent=self.reply_sent,
                episode_id=self.result.episode_id,
                memory_errors=len(self.result.memory_errors),
            )
            if self.reply_error:
                data["reply_error"] = self.reply_error
        return data


def forget_old_updates():
    """Delete seen update_ids older than TELEGRAM_UPDATE_RETENTION_HOURS; returns how many."""
    cutoff = timezone.now() - timedelta(hours=workflow_settings.TELEGRAM_UPDATE_RETENTION_HOURS)
    deleted, _ = TelegramUpdate.objects.filter(received_at__lt=cutoff).delete()
    return deleted


def handle_update(workflow, update, *, bot=None) -> UpdateOutcome:
    """Run `workflow` for one Telegram update, once per update_id, and send the reply.

    The caller has checked that `update` is an object with an integer update_id. Updates without a
    message, edited message or callback query are acknowledged without a run. If the run itself
    raises, the update is released again so that Telegram's retry runs it.
    """
    if telegram_update_kind(update) is None:
        return UpdateOutcome("ignored")
    try:
        with transaction.atomic():
            # Recorded first: a retried update_id then fails the unique constraint.
            seen = TelegramUpdate.objects.create(workflow=workflow, update_id=update["update_id"])
    except IntegrityError:
        return UpdateOutcome("duplicate")
    if update["update_id"] % 1000 == 0:
        forget_old_updates()
    try:
        result = run_workflow(workflow, {"type": "telegram", "payload": update})
    except Exception:  # released, then re-raised: Telegram retries and the retry runs
        TelegramUpdate.objects.filter(pk=seen.pk).delete()
        raise
    outcome = UpdateOutcome("ran", result=result)
    bot = bot or get_bot_api()
    try:
        if "callback_query" in update and update["callback_query"].get("id"):
            bot.answer_callback_query(update["callback_query"]["id"])
        if result.reply and result.trigger.reply_to:
            bot.send_message(int(result.trigger.reply_to), result.reply)
            outcome.reply_sent = True
    except TelegramError as exc:
        logger.error("workflow %s: update %s: reply not sent: %s", workflow.slug, update["update_id"], exc)
        outcome.reply_error = str(exc)
    return outcome


on_workflow_settings_changed(reset_bot_api)
