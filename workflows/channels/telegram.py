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
from django.utils import timezone

from ..conf import on_workflow_settings_changed, workflow_settings
from ..exceptions import TelegramError
from ..graph.runtime import RunResult, run_workflow
from ..graph.triggers import telegram_update_ignored, telegram_update_kind
from ..models import TelegramUpdate, UpdateStatus
from .claims import claim_update, finish, process_token, release
from .outbox import queue_reply, send_now, send_pending_reply

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
                f"{method}: HTTP {response.status_code}: {self._redact(str(body.get('description', '')))}",
                status_code=response.status_code,
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
    """What happened to one update: ran, a duplicate, ignored, or busy (another process runs it now).

    `reply_pending` says the reply is queued in the outbox but not sent yet; the webhook then answers
    503 so that Telegram's retry of the update sends it, if the delivery worker has not by then.
    """

    status: str  # "ran", "duplicate", "ignored", "busy"
    result: RunResult | None = None
    reply_sent: bool = False
    reply_pending: bool = False
    reply_error: str = ""

    @property
    def http_status(self):
        return 503 if self.status == "busy" or self.reply_pending else 200

    def as_dict(self):
        data = {"ok": self.http_status == 200, "status": self.status}
        if self.result is not None or self.status == "duplicate":
            data.update(reply_sent=self.reply_sent, reply_pending=self.reply_pending)
        if self.result is not None:
            data.update(episode_id=self.result.episode_id, memory_errors=len(self.result.memory_errors))
        if self.reply_error:
            data["reply_error"] = self.reply_error
        if self.status == "busy":
            data["errors"] = {"update_id": ["this update is being run right now; retry later"]}
        return data


def forget_old_updates():
    """Delete update records older than TELEGRAM_UPDATE_RETENTION_HOURS (Telegram stopped redelivering them
    long before), except a run some live process still holds; returns how many."""
    now = timezone.now()
    cutoff = now - timedelta(hours=workflow_settings.TELEGRAM_UPDATE_RETENTION_HOURS)
    old = TelegramUpdate.objects.filter(received_at__lt=cutoff)
    deleted, _ = old.exclude(status=UpdateStatus.RUNNING, claimed_until__gt=now).delete()
    return deleted


def handle_update(workflow, update, *, bot=None) -> UpdateOutcome:
    """Run `workflow` for one Telegram update, once per update_id, and send the reply through the outbox.

    The caller has checked that `update` is an object with an integer update_id. Updates without a
    message, edited message or callback query, and those of shared senders when TELEGRAM_SHARED_SENDERS
    is "ignore", are acknowledged without a run. The update is claimed first (workflows.channels.claims): a
    finished one is a duplicate (whose reply is sent now if it is still pending), one running elsewhere
    is "busy". If the run itself raises, the update is released so that Telegram's retry runs it. The
    finish, the reply and the run's record are one transaction; the reply is sent after it commits
    (workflows.channels.outbox).
    """
    if telegram_update_kind(update) is None:
        return UpdateOutcome("ignored")
    ignored = telegram_update_ignored(update)
    if ignored:
        logger.info("workflow %s: update %s not run: %s", workflow.slug, update["update_id"], ignored)
        return UpdateOutcome("ignored")
    claim = claim_update(workflow, update["update_id"])
    if claim.state == "busy":
        return UpdateOutcome("busy")
    bot = bot or get_bot_api()
    if claim.state == "done":
        return _duplicate(claim, bot, workflow)
    if update["update_id"] % 1000 == 0:
        forget_old_updates()
    callback_id = update.get("callback_query", {}).get("id") if "callback_query" in update else ""
    done = {}

    def finish_and_queue(result, person_kept):
        # Inside the transaction that writes the run's record, the person held (or found forgotten).
        done["finished"] = finish(claim)
        done["reply"] = None
        text = result.reply if result.trigger.reply_to else ""
        if done["finished"] and (text or callback_id):
            user_id = (result.user or {}).get("id")
            if not person_kept:
                logger.warning(
                    "reply to update %s not kept: memory user %s was forgotten meanwhile", claim.row.pk, user_id
                )
                return
            done["reply"] = queue_reply(
                claim.row,
                claim.token,
                user_id=user_id,
                chat_id=result.trigger.reply_to,
                text=text,
                callback_query_id=str(callback_id or ""),
                person_held=True,
            )

    try:
        result = run_workflow(workflow, {"type": "telegram", "payload": update}, on_finish=finish_and_queue)
    except Exception:  # released, then re-raised: Telegram retries and the retry runs (the run, or
        # its finish, was not recorded)
        release(claim)
        raise
    finished, reply = done["finished"], done["reply"]
    if not finished:  # this process stalled past its lease and another took the update over
        logger.warning(
            "workflow %s: update %s was taken over by another process mid-run", workflow.slug, claim.row.update_id
        )
        return UpdateOutcome("busy", result=result)
    outcome = UpdateOutcome("ran", result=result)
    if reply is not None:
        _apply(outcome, send_now(reply, bot), workflow, update["update_id"])
    return outcome


def _duplicate(claim, bot, workflow):
    outcome = UpdateOutcome("duplicate")
    sent = send_pending_reply(claim.row, process_token(), bot)
    if sent is None:
        outcome.reply_sent = True  # sent before, or the run had nothing to say
    else:
        _apply(outcome, sent, workflow, claim.row.update_id)
    return outcome


def _apply(outcome, sent, workflow, update_id):
    outcome.reply_sent = sent.sent
    outcome.reply_pending = sent.status == "pending"
    if sent.error:
        outcome.reply_error = sent.error
    if not sent.sent and sent.status != "lost":
        logger.error(
            "workflow %s: update %s: reply not sent (%s): %s", workflow.slug, update_id, sent.status, sent.error
        )


on_workflow_settings_changed(reset_bot_api)
