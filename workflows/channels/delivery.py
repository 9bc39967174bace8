"""Delivering reminders: claim due ones, send each through the person's channel, record what happened.

The same worker also sends the Telegram replies waiting in the outbox (`deliver_replies`, see
workflows.channels.outbox), claimed and recorded the same way.

One round (`deliver_due`) is three steps, and only the first and last touch the database:

1. **Claim** a batch in one short transaction: the due, pending, unclaimed rows are selected
   (PostgreSQL: `SELECT … FOR UPDATE SKIP LOCKED`, so concurrent workers take different rows without
   waiting; SQLite: the transaction holds the database's write lock from BEGIN IMMEDIATE) and marked
   with this claim's token and a lease (`claimed_until`) by an UPDATE that repeats the conditions, so
   a row is claimed by one worker even where the select locks nothing.
2. **Send** each claimed reminder outside any transaction, through a channel of
   workflows.channels.sending (see `routes`): the channel of the conversation it was set in (Telegram;
   the workflow's webhook URL for a conversation whose channel has no push API), else the one the
   person used last.
3. **Record** each outcome at once, in its own statement, guarded by the claim token: delivered; or,
   on failure, a retry at `now + REMINDER_BACKOFF_SECONDS * 2 ** (attempts - 1)` (capped), or `failed`
   with `last_error` once REMINDER_MAX_ATTEMPTS are used. A delivered reminder is then written into
   its conversation's thread as an AI message (id `reminder-<id>`), so the next turn sees it; a
   reminder sent twice replaces its own message there rather than adding another.

A worker that crashes leaves its claims behind; they are taken again once the lease passes. A worker
never starts a send with less than the channels' timeout (+ 1 s) left on its lease, so a live worker's
claim does not expire under a send and no two workers send one reminder while both hold it. Leases
are set and compared with each worker's own clock: keep the hosts' clocks in sync (NTP), since skew
between workers eats into that margin.

Delivery is at least once, not exactly once, and this is the window: the Bot API has no idempotency
key and no way to ask whether a message went out (a webhook receiver gets one, `Idempotency-Key`,
to drop the repeat itself), so a worker killed after the channel accepted a
message and before its "delivered" UPDATE committed (one reminder per worker: the send's response,
then one short statement) leaves that reminder pending, and it is sent again after the lease. The
reverse order (mark, then send) would lose a message in the same window instead; a duplicate reminder
is the lesser harm. A stall longer than the lease's margin (a suspended process) can also let another
worker take a reminder that is still being sent; the late record then finds its token gone and logs it.
"""

import contextlib
import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass, field, replace
from datetime import timedelta

from django.db import DatabaseError, InterfaceError, close_old_connections, connection, transaction
from django.db.models import Q
from django.utils import timezone

from memory.service import MemoryService

from ..conf import workflow_settings
from ..models import Reminder, ReminderStatus, Thread
from . import outbox, sending
from .telegram import get_bot_api

logger = logging.getLogger("engram.workflows")

# The lease margin on top of the send timeout: a worker sends only while this much is left.
LEASE_MARGIN = timedelta(seconds=1)
# Threads looked at per person when a reminder's own conversation cannot be reached.
RECENT_THREADS = 20


def reminder_text(reminder):
    return f"Reminder: {reminder.message}"


COUNTS = ("claimed", "delivered", "retried", "failed", "lost", "released", "threaded")
REPLY_COUNTS = ("replies_claimed", "replies_sent", "replies_retried", "replies_failed")


@dataclass
class RoundReport:
    """What a worker did: reminders claimed, delivered, scheduled again, failed for good, lost to another
    worker; and Telegram replies from the outbox claimed, sent, to be retried, failed for good."""

    claimed: int = 0
    delivered: int = 0
    retried: int = 0
    failed: int = 0
    lost: int = 0
    released: int = 0
    threaded: int = 0  # delivered reminders written into their conversation's thread
    replies_claimed: int = 0
    replies_sent: int = 0
    replies_retried: int = 0
    replies_failed: int = 0
    errors: list = field(default_factory=list)

    def add(self, other):
        for name in COUNTS + REPLY_COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.errors = (self.errors + other.errors)[-10:]

    def as_dict(self):
        return {name: getattr(self, name) for name in COUNTS + REPLY_COUNTS}


def worker_name():
    """Who claims: host, process and a random part (a restarted process with the same pid is someone else)."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _due(now):
    unclaimed = Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)
    return Q(status=ReminderStatus.PENDING, next_attempt_at__lte=now) & unclaimed


def claim(token, *, batch, lease, now=None):
    """Claim up to `batch` due reminders for `lease` seconds under `token`; returns them, soonest first."""
    now = now or timezone.now()
    until = now + timedelta(seconds=lease)
    with transaction.atomic():
        ids = list(
            Reminder.objects.select_for_update(skip_locked=True)
            .filter(_due(now))
            .order_by("next_attempt_at", "pk")
            .values_list("pk", flat=True)[:batch]
        )
        if not ids:
            return []
        Reminder.objects.filter(_due(now), pk__in=ids).update(claimed_by=token, claimed_until=until)
    return list(
        Reminder.objects.filter(claimed_by=token, status=ReminderStatus.PENDING).order_by("next_attempt_at", "pk")
    )


def routes(reminders):
    """{reminder id: (channel, Address)} for these reminders; one missing has no channel that reaches it.

    A reminder goes back to the conversation it was set in when a channel reaches it there (its
    Telegram chat; the workflow's webhook URL for a conversation on a channel without a push API);
    else to the latest of the person's conversations one reaches; else to a channel that reaches the
    person anywhere (their Telegram id). Two queries for any number of reminders.
    """
    reminders = list(reminders)
    user_ids = {r.user_id for r in reminders}
    identities = {}
    for user_id, channel, external_id in MemoryService().channel_identities(user_ids):
        identities.setdefault(user_id, {}).setdefault(channel, external_id)
    threads_of = {}
    rows = (
        Thread.objects.filter(user_id__in=user_ids)
        .select_related("workflow")
        .order_by("user_id", "-last_activity", "-pk")
    )
    for thread in rows:
        threads_of.setdefault(thread.user_id, []).append(thread)
    found = {}
    for reminder in reminders:
        person = sending.Person(reminder.user_id, identities.get(reminder.user_id, {}))
        theirs = threads_of.get(reminder.user_id, [])
        own = [t for t in theirs if reminder.thread_id and t.thread_id == reminder.thread_id]
        for thread in [*own, *theirs[:RECENT_THREADS], None]:
            found_route = sending.route(person, thread)
            if found_route is not None:
                channel, address = found_route
                found[reminder.pk] = (channel, replace(address, reference=f"reminder:{reminder.pk}"))
                break
    return found


def destinations(user_ids):
    """{user id: (channel, destination)}: where a reminder without a conversation would reach each person."""
    people = [Reminder(pk=-n - 1, user_id=u) for n, u in enumerate(user_ids)]
    found = routes(people)
    return {r.user_id: (found[r.pk][0].name, found[r.pk][1].to) for r in people if r.pk in found}


def _record(reminder, token, **changes):
    """Write one outcome if this claim still holds the row; False if another worker took it since."""
    # The claim token guards the row, so the attempts read at the claim are still current.
    changes.update(claimed_by="", claimed_until=None, attempts=reminder.attempts + 1)
    return Reminder.objects.filter(pk=reminder.pk, claimed_by=token).update(**changes) == 1


@contextlib.contextmanager
def _outcomes_without_flush_wait():
    """PostgreSQL: the outcomes recorded inside commit without waiting for the WAL flush.

    A flush can cost more than the send itself, and it sits in the window between a send and its
    record, which is the window where a crash makes a duplicate. Without it a database crash can forget the last fraction
    of a second of outcomes, so those reminders are sent again: never lost. SQLite in WAL mode with
    synchronous=NORMAL (the site's setting) makes the same trade. Set for the session (one statement
    per round, not per reminder) and reset afterwards, so the connection goes back as it was.
    """
    if connection.vendor != "postgresql" or workflow_settings.REMINDER_SYNCHRONOUS_COMMIT:
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit TO OFF")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET synchronous_commit")


def _backoff(attempts):
    seconds = workflow_settings.REMINDER_BACKOFF_SECONDS * 2 ** max(0, attempts - 1)
    return timedelta(seconds=min(seconds, workflow_settings.REMINDER_BACKOFF_MAX_SECONDS))


def _release(token, ids):
    """Give back claimed reminders this worker will not send (stopping, or its lease ran short)."""
    if not ids:
        return 0
    return Reminder.objects.filter(pk__in=ids, claimed_by=token).update(claimed_by="", claimed_until=None)


def deliver_due(*, worker=None, batch=None, lease=None, stop=None):
    """One round: claim a batch of due reminders, send and record each. Returns a RoundReport."""
    if connection.in_atomic_block:  # the sends below must not hold a transaction open
        raise RuntimeError("deliver_due() must run outside a transaction")
    batch = batch or workflow_settings.REMINDER_BATCH_SIZE
    lease = lease or workflow_settings.REMINDER_LEASE_SECONDS
    send_time = timedelta(seconds=sending.send_timeout()) + LEASE_MARGIN
    if timedelta(seconds=lease) <= send_time:
        raise ValueError(
            f"lease: {lease:g} s is too short; it must exceed the channels' timeout + 1 s "
            f"({send_time.total_seconds():g} s: TELEGRAM_TIMEOUT, REMINDER_WEBHOOK_TIMEOUT)"
        )
    token = f"{worker or worker_name()}#{uuid.uuid4().hex[:8]}"
    report = RoundReport()
    claimed = claim(token, batch=batch, lease=lease)
    report.claimed = len(claimed)
    if not claimed:
        return report
    where = routes(claimed)
    with _outcomes_without_flush_wait():
        delivered = _send_claimed(claimed, where, token, send_time, stop, report)
    # After the outcomes: a thread waits for a turn in progress, and must not hold up the records.
    for reminder, text in delivered:
        _write_to_thread(reminder, text, report)
    return report


def _send_claimed(claimed, where, token, send_time, stop, report):
    """Send and record each claimed reminder; returns [(reminder, text)] of those delivered."""
    delivered = []
    for index, reminder in enumerate(claimed):
        if (stop is not None and stop.is_set()) or timezone.now() + send_time > reminder.claimed_until:
            report.released += _release(token, [r.pk for r in claimed[index:]])
            break
        text = reminder_text(reminder)
        if reminder.pk not in where:
            names = ", ".join(c.name for c in sending.channels())
            _failed(reminder, token, f"no channel to deliver to: none of {names} reaches the person", report)
            continue
        channel, address = where[reminder.pk]
        try:
            result = channel.send(text, address)
        except Exception as exc:  # noqa: BLE001  (a registered channel's bug must not stop the round)
            logger.exception("reminder %s: channel %s raised", reminder.pk, channel.name)
            result = sending.DeliveryResult(False, f"{channel.name}: {type(exc).__name__}: {exc}")
        if not result.ok:
            _failed(reminder, token, result.error or f"{channel.name}: not delivered", report)
            continue
        now = timezone.now()
        if _record(
            reminder,
            token,
            status=ReminderStatus.DELIVERED,
            delivered_at=now,
            channel=channel.name,
            destination=address.to[:255],
            last_error="",
        ):
            report.delivered += 1
            delivered.append((reminder, text))
        else:
            report.lost += 1
            logger.warning("reminder %s was sent, but another worker had taken it: it may arrive twice", reminder.pk)
    return delivered


def _write_to_thread(reminder, text, report):
    """The sent reminder as the agent's message in the conversation it was set in; logged on failure.

    Only conversations of a workflow's agent (tracked threads with a workflow): another graph's thread
    has a state of its own that this message's shape may not fit.
    """
    if not reminder.thread_id:
        return
    try:
        if not Thread.objects.filter(thread_id=reminder.thread_id, workflow__isnull=False).exists():
            return
        # Here, not at the top: a process that never writes into a thread (a task worker delivering
        # reminders set outside a conversation) need not hold LangGraph and LangChain (about 26 MB).
        from langchain_core.messages import AIMessage

        from ..graph.agent import write_to_thread

        write_to_thread(reminder.thread_id, AIMessage(content=text, id=f"reminder-{reminder.pk}"))
    except Exception as exc:  # noqa: BLE001  (the checkpointer's errors have no common base class)
        logger.error("reminder %s was sent but not written into its thread: %s", reminder.pk, exc)
        report.errors = (report.errors + [f"reminder {reminder.pk}: not written into its thread: {exc}"])[-10:]
        return
    report.threaded += 1


def _failed(reminder, token, error, report):
    attempts = reminder.attempts + 1
    now = timezone.now()
    if attempts >= workflow_settings.REMINDER_MAX_ATTEMPTS:
        done = _record(reminder, token, status=ReminderStatus.FAILED, last_error=error)
        report.failed += done
        logger.error("reminder %s failed after %s attempts: %s", reminder.pk, attempts, error)
    else:
        done = _record(reminder, token, next_attempt_at=now + _backoff(attempts), last_error=error)
        report.retried += done
        logger.warning("reminder %s: attempt %s failed, retried later: %s", reminder.pk, attempts, error)
    report.lost += not done
    report.errors = (report.errors + [f"reminder {reminder.pk}: {error}"])[-10:]


def deliver_replies(*, worker=None, batch=None, lease=None, stop=None, report=None):
    """One round of the outbox: Telegram replies whose send failed before and whose retry time has come."""
    if connection.in_atomic_block:
        raise RuntimeError("deliver_replies() must run outside a transaction")
    report = report or RoundReport()
    token = f"{worker or worker_name()}#{uuid.uuid4().hex[:8]}"
    replies = outbox.deliver_due_replies(
        get_bot_api,
        token,
        batch=batch or workflow_settings.REMINDER_BATCH_SIZE,
        lease=lease or workflow_settings.REMINDER_LEASE_SECONDS,
        stop=stop,
    )
    report.replies_claimed += replies.claimed
    report.replies_sent += replies.sent
    report.replies_retried += replies.retried
    report.replies_failed += replies.failed
    report.lost += replies.lost
    report.released += replies.released
    if replies.error:
        report.errors = (report.errors + [f"replies: {replies.error}"])[-10:]
    return report


def run_worker(*, once=False, batch=None, lease=None, poll=None, stop=None, on_round=None):
    """Deliver reminders and the outbox's Telegram replies until `stop` is set (or, with `once`, until
    nothing is due). Returns the total RoundReport.

    Database errors in the loop are logged and the loop goes on after a pause (a restarted database,
    a locked SQLite file); with `once` they are raised.
    """
    stop = stop or threading.Event()
    poll = workflow_settings.REMINDER_POLL_SECONDS if poll is None else poll
    worker = worker_name()
    total = RoundReport()
    while not stop.is_set():
        close_old_connections()  # a long-lived process: drop connections past their age or broken
        try:
            report = deliver_due(worker=worker, batch=batch, lease=lease, stop=stop)
            deliver_replies(worker=worker, batch=batch, lease=lease, stop=stop, report=report)
        except Exception as exc:
            if once or not _transient(exc):
                raise
            logger.exception("reminders: a round failed; trying again in %s s", poll)
            stop.wait(poll)
            continue
        total.add(report)
        if on_round is not None:
            on_round(report, total)
        if report.claimed == 0 and report.replies_claimed == 0:
            if once:
                break
            stop.wait(poll)
    return total


def _transient(exc):
    return isinstance(exc, (DatabaseError, InterfaceError))
