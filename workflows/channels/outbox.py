"""The reply outbox: a Telegram run's reply is a row before it is a message, and it is sent until it is.

`queue_reply` writes the reply in the transaction that records the run as finished (workflows.channels.claims),
already claimed by the process that ran it, which sends it right after the commit (`send_reply`). A
reply that could not be sent then (the Bot API down, refusing, slow) stays `pending`, with a retry
time that backs off (TELEGRAM_REPLY_BACKOFF_SECONDS × 2^(attempts − 1)), and is sent by whoever comes
first: the delivery worker (`manage.py memory reminders`, `deliver_due_replies`, claiming due rows as
it claims reminders: a lease, `SELECT … FOR UPDATE SKIP LOCKED` on PostgreSQL, a conditional UPDATE)
or the update's next delivery by Telegram (`send_pending_reply`). Every send happens outside any
transaction, under a claim, and is recorded at once, guarded by the claim.

Sent once per update, at least once: the Bot API has no idempotency key, so a process killed between
Telegram accepting a reply and its "sent" UPDATE leaves the reply pending, to be sent again after the
lease. Each process sends one reply at a time (`_send_lock`), so a killed process leaves at most one
such reply. After a failed send, a process leaves new replies to the retries for
TELEGRAM_REPLY_BACKOFF_SECONDS rather than have every request wait on a Bot API that is down.
"""

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import Q
from django.dispatch import receiver
from django.utils import timezone

from memory.exceptions import PersonForgotten
from memory.service import MemoryService
from memory.signals import users_deleting

from ..conf import on_workflow_settings_changed, workflow_settings
from ..exceptions import TelegramError
from ..models import ReplyStatus, TelegramReply

logger = logging.getLogger("engram.workflows")

# One send (and its record) at a time in this process: see the module's docstring.
_send_lock = threading.Lock()
_paused_until = 0.0  # time.monotonic() before which this process leaves new replies to the retries


def _lease():
    return timedelta(seconds=float(workflow_settings.TELEGRAM_RUN_LEASE_SECONDS))


def _send_time():
    """The time a send may take: a sender starts one only with this much of its lease left."""
    return timedelta(seconds=float(workflow_settings.TELEGRAM_TIMEOUT) + 1)


def _backoff(attempts):
    seconds = workflow_settings.TELEGRAM_REPLY_BACKOFF_SECONDS * 2 ** max(0, attempts - 1)
    return timedelta(seconds=min(seconds, workflow_settings.TELEGRAM_REPLY_BACKOFF_MAX_SECONDS))


def claim_token(holder):
    """A token for one claim of a reply: the holder (a process) and a random part."""
    return f"{holder}#{uuid.uuid4().hex[:8]}"


def queue_reply(update, holder, *, user_id, chat_id, text, callback_query_id="", person_held=False):
    """The reply of a finished run, claimed by `holder` for an immediate send (`send_now`); call inside
    the transaction that records the finish. None if its person was forgotten while the run went on
    (on any server): checked under the person's lock (memory/rules/persons.py), so no reply row naming
    them is written after their forget commits, and none is sent. `person_held`: the caller's
    transaction holds that lock already (and found the person)."""
    if user_id is not None and not person_held:
        try:
            MemoryService().hold_person(user_id)
        except PersonForgotten:
            logger.warning("reply to update %s not kept: memory user %s was forgotten meanwhile", update.pk, user_id)
            return None
    now = timezone.now()
    return TelegramReply.objects.create(
        update=update,
        user_id=user_id,
        chat_id=str(chat_id),
        text=text,
        callback_query_id=callback_query_id,
        next_attempt_at=now,
        claimed_by=claim_token(holder),
        claimed_until=now + _lease(),
    )


@dataclass
class Sent:
    """What became of one send: status "sent", "pending" (to be retried), "failed" (for good) or "lost"."""

    status: str
    error: str = ""

    @property
    def sent(self):
        return self.status == "sent"


def send_reply(reply, token, bot):
    """Send a reply this claim holds (outside any transaction) and record the outcome; returns a Sent."""
    if connection.in_atomic_block:  # a send can take TELEGRAM_TIMEOUT: never with a transaction open
        raise RuntimeError("send_reply() must run outside a transaction")
    if not _send_lock.acquire(timeout=_send_time().total_seconds()):
        _release(reply, token)
        return Sent("pending", "another reply of this process is being sent")
    try:
        if timezone.now() + _send_time() > reply.claimed_until:
            _release(reply, token)  # too little of the lease left for a send: leave it to the next sender
            return Sent("pending", "the claim's lease ran short")
        try:
            _send(reply, bot)
        except TelegramError as exc:
            return _failed(reply, token, exc)
        if not _record(reply, token, status=ReplyStatus.SENT, sent_at=timezone.now(), text="", last_error=""):
            logger.warning("reply %s was sent, but another sender had taken it: it may arrive twice", reply.pk)
            return Sent("lost")
        return Sent("sent")
    finally:
        _send_lock.release()


def _send(reply, bot):
    if reply.callback_query_id and reply.attempts == 0:
        # A callback query must be answered within seconds: once, best effort; the reply is what matters.
        try:
            bot.answer_callback_query(reply.callback_query_id)
        except TelegramError as exc:
            logger.warning("reply %s: the callback query was not answered: %s", reply.pk, exc)
    if reply.text and reply.chat_id:
        chat = int(reply.chat_id) if reply.chat_id.lstrip("-").isdigit() else reply.chat_id
        bot.send_message(chat, reply.text)


def _record(reply, token, **changes):
    """Write one outcome if this claim still holds the reply; False if another sender took it since."""
    changes.update(claimed_by="", claimed_until=None, attempts=reply.attempts + 1)
    return TelegramReply.objects.filter(pk=reply.pk, claimed_by=token).update(**changes) == 1


def _release(reply, token):
    TelegramReply.objects.filter(pk=reply.pk, claimed_by=token).update(claimed_by="", claimed_until=None)


def _failed(reply, token, exc):
    global _paused_until
    _paused_until = time.monotonic() + float(workflow_settings.TELEGRAM_REPLY_BACKOFF_SECONDS)
    attempts, error = reply.attempts + 1, str(exc)
    if exc.permanent or attempts >= workflow_settings.TELEGRAM_REPLY_MAX_ATTEMPTS:
        done = _record(reply, token, status=ReplyStatus.FAILED, last_error=error)
        logger.error(
            "reply %s to chat %s failed for good after %s attempts: %s", reply.pk, reply.chat_id, attempts, error
        )
        return Sent("failed" if done else "lost", error)
    done = _record(reply, token, next_attempt_at=timezone.now() + _backoff(attempts), last_error=error)
    logger.warning("reply %s: attempt %s failed, retried later: %s", reply.pk, attempts, error)
    return Sent("pending" if done else "lost", error)


def send_now(reply, bot):
    """The first send, by the request that ran the update (holding the claim `queue_reply` made); skipped
    (left pending) while this process pauses after a failed send."""
    token = reply.claimed_by
    if time.monotonic() < _paused_until:
        _release(reply, token)
        return Sent("pending", "the Bot API failed a moment ago: the reply is queued for a retry")
    return send_reply(reply, token, bot)


def _free(now):
    return Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)


def send_pending_reply(update, holder, bot):
    """On a later delivery of a finished update: send its reply if it is still pending and nobody holds it.

    Returns a Sent, or None when there is no reply or it is no longer pending. Telegram's retry is
    itself backed off, so the reply's own retry time is not waited for.
    """
    reply = TelegramReply.objects.filter(update=update).first()
    if reply is None or reply.status != ReplyStatus.PENDING:
        return None if reply is None or reply.status == ReplyStatus.SENT else Sent("failed", reply.last_error)
    now, token = timezone.now(), claim_token(holder)
    if not TelegramReply.objects.filter(_free(now), pk=reply.pk, status=ReplyStatus.PENDING).update(
        claimed_by=token, claimed_until=now + _lease()
    ):
        return Sent("pending", "another sender holds the reply")
    reply.refresh_from_db()
    return send_reply(reply, token, bot)


@dataclass
class ReplyRound:
    claimed: int = 0
    sent: int = 0
    retried: int = 0
    failed: int = 0
    lost: int = 0
    released: int = 0
    error: str = ""


def claim_due(token, *, batch, lease, now=None):
    """Claim up to `batch` pending replies whose retry time has come, for `lease` seconds, oldest first."""
    now = now or timezone.now()
    due = Q(status=ReplyStatus.PENDING, next_attempt_at__lte=now) & _free(now)
    with transaction.atomic():
        ids = list(
            TelegramReply.objects.select_for_update(skip_locked=True)
            .filter(due)
            .order_by("next_attempt_at", "pk")
            .values_list("pk", flat=True)[:batch]
        )
        if not ids:
            return []
        TelegramReply.objects.filter(due, pk__in=ids).update(
            claimed_by=token, claimed_until=now + timedelta(seconds=lease)
        )
    return list(
        TelegramReply.objects.filter(claimed_by=token, status=ReplyStatus.PENDING).order_by("next_attempt_at", "pk")
    )


def deliver_due_replies(get_bot, token, *, batch, lease, stop=None):
    """One round of the delivery worker: claim due replies, send and record each. Returns a ReplyRound.

    `get_bot()` gives the Bot API client, asked for only when there is something to send.
    """
    report = ReplyRound()
    claimed = claim_due(token, batch=batch, lease=lease)
    report.claimed = len(claimed)
    if not claimed:
        return report
    try:
        bot = get_bot()
    except TelegramError as exc:  # no bot token: give the replies back, the loop logs the error
        for reply in claimed:
            _release(reply, token)
        report.released = len(claimed)
        report.error = str(exc)
        return report
    for reply in claimed:
        if stop is not None and stop.is_set():
            _release(reply, token)
            report.released += 1
            continue
        outcome = send_reply(reply, token, bot)
        report.sent += outcome.status == "sent"
        report.retried += outcome.status == "pending"
        report.failed += outcome.status == "failed"
        report.lost += outcome.status == "lost"
    return report


@receiver(users_deleting, dispatch_uid="workflows_replies_of_deleted_users")
def _users_deleting(sender, user_ids, **kwargs):
    # A reply not yet sent holds what the run said to the person: it goes with them.
    TelegramReply.objects.filter(user_id__in=list(user_ids)).delete()


def resume_sending():
    """End this process's pause after a failed send (its settings changed: another Bot API, another token)."""
    global _paused_until
    _paused_until = 0.0


on_workflow_settings_changed(resume_sending)
