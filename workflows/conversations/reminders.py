"""Reminders: reading when, scheduling, cancelling, and keeping them with their person (merge, export, forget).

A reminder belongs to a memory user; the `remind` tool (workflows.graph.tools) schedules one for the user
an agent talks to, and `manage.py memory reminders` (workflows.channels.delivery) sends it when it is due.
Reminders join memory's lifecycle through its signals, as threads do: `users_deleting` deletes a
forgotten person's reminders (memory never imports workflows), `users_merged` moves them to the
surviving user, `users_footprint` and `person_exporting` count and export them, and `prune_requested`
(`memory prune`) deletes finished ones older than REMINDER_RETENTION_DAYS. They are a transfer kind
("reminder"), so `memory export` writes them and `memory import` reads them back.
"""

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Count, Q
from django.dispatch import receiver
from django.utils import dateparse, timezone

from memory.exceptions import InvalidMemoryArgument, PersonForgotten
from memory.service import BatchDelete, MemoryService, TransferKind, register_transfer_kind
from memory.signals import person_exporting, prune_requested, users_deleting, users_footprint, users_merged

from ..conf import workflow_settings
from ..models import Reminder, ReminderStatus

MAX_MESSAGE_LENGTH = 2000
EXAMPLES = "for example 'in 2 hours', 'tomorrow at 9am' or 2026-05-01T09:00:00+00:00"
# A due time may lie this far behind now and still be taken (delivered at once): a caller's "now"
# has passed by the time it arrives. Anything older is refused, as a time that is not in the future.
PAST_TOLERANCE = timedelta(seconds=60)
# Clock times a text names: "25:00", "9:75", "13pm", "7.30am" (not a zone offset like +02:00).
# dateparser drops a time it cannot read and keeps the rest ("tomorrow at 25:00" would be tomorrow at
# this hour), so each is checked, and the time read must be one of them.
_CLOCK = re.compile(
    r"(?<![\d:.+-])(?P<hour>\d{1,2})(?:[:.](?P<minute>\d{2})(?::(?P<second>\d{2}))?)?\s*(?P<half>[ap]\.?m\b\.?)?",
    re.IGNORECASE,
)


def _clock_times(text):
    """The (hour, minute) of each clock time `text` names, refusing one that does not exist (an hour
    past 23, or past 12 with am/pm; a minute or second past 59)."""
    times = []
    for found in _CLOCK.finditer(text):
        minute, half = found.group("minute"), found.group("half")
        if minute is None and half is None:
            continue  # a bare number: a day, a count ("in 25 minutes"), a year
        hour, second = int(found.group("hour")), found.group("second")
        hours = 12 if half else 23
        if hour > hours or int(minute or 0) > 59 or int(second or 0) > 59:
            raise InvalidMemoryArgument(
                "when",
                f"{found.group(0).strip()!r} in {text!r} is not a time of day "
                f"(hours 0-{hours}{' with am/pm' if half else ''}, minutes 0-59); say it {EXAMPLES}",
            )
        if half:
            hour = hour % 12 + (12 if half.lower().startswith("p") else 0)
        times.append((hour, int(minute or 0), found.group(0).strip()))
    return times


def check_due(moment, *, now=None, described=None):
    """An aware due time, refused when it is past (beyond PAST_TOLERANCE) or more than
    REMINDER_MAX_DAYS_AHEAD away: the same rule for a time read from text and one given as a datetime."""
    now = now or timezone.now()
    described = described if described is not None else moment.isoformat(timespec="minutes")
    if moment < now - PAST_TOLERANCE:
        raise InvalidMemoryArgument(
            "when", f"{described!r} is {moment.isoformat(timespec='minutes')}, which is not in the future"
        )
    days = workflow_settings.REMINDER_MAX_DAYS_AHEAD
    if moment > now + timedelta(days=days):
        raise InvalidMemoryArgument("when", f"{described!r} is more than {days} days ahead")
    return moment


def parse_when(when, *, now=None):
    """An aware datetime from an ISO 8601 time or a natural one ("in 2 hours", "tomorrow at 9am").

    Times without an offset, natural ones included, are read in Django's current time zone. Raises
    InvalidMemoryArgument("when", ...) when nothing can be read, a clock time it names does not exist
    ("tomorrow at 25:00"), or the time is not in the future (within REMINDER_MAX_DAYS_AHEAD; see check_due).
    """
    now = now or timezone.now()
    text = " ".join(str(when or "").split())
    if not text:
        raise InvalidMemoryArgument("when", f"must say when, {EXAMPLES}")
    if len(text) > 200:
        raise InvalidMemoryArgument("when", "must be at most 200 characters")
    clock_times = _clock_times(text)
    zone = timezone.get_current_timezone()
    try:
        moment = dateparse.parse_datetime(text)
    except ValueError:  # well-formed but impossible, like 2026-02-30T09:00
        moment = None
    if moment is None:
        import dateparser  # loads its language data on first use: only where reminders are set

        moment = dateparser.parse(
            text,
            languages=list(workflow_settings.REMINDER_LANGUAGES) or None,
            settings={
                "RELATIVE_BASE": now.astimezone(zone).replace(tzinfo=None),
                "TIMEZONE": str(zone),
                "RETURN_AS_TIMEZONE_AWARE": True,
                "PREFER_DATES_FROM": "future",
            },
        )
        if moment is not None and clock_times and (moment.hour, moment.minute) not in {t[:2] for t in clock_times}:
            # dateparser left out the time of day it could not read: refuse rather than guess.
            raise InvalidMemoryArgument(
                "when", f"could not read the time of day {clock_times[0][2]!r} in {text!r}; say it {EXAMPLES}"
            )
    if moment is None:
        raise InvalidMemoryArgument("when", f"could not read a time from {text!r}; say it {EXAMPLES}")
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, zone)
    return check_due(moment, now=now, described=text)


def clean_message(message):
    text = str(message or "").replace("\x00", "").strip()
    if not text:
        raise InvalidMemoryArgument("message", "must not be blank")
    if len(text) > MAX_MESSAGE_LENGTH:
        raise InvalidMemoryArgument("message", f"must be at most {MAX_MESSAGE_LENGTH} characters")
    return text


def schedule_reminder(*, user_id, when, message, agent_id="", thread_id="", now=None):
    """A pending reminder for the memory user `user_id`; bad input raises InvalidMemoryArgument and writes nothing.

    `thread_id`: the conversation it was set in; it goes out on that conversation's channel and is
    written into its history when sent."""
    if user_id is None:
        raise InvalidMemoryArgument("user", "nobody is identified in this conversation, so there is no one to remind")
    if isinstance(when, datetime):
        # A datetime passes the same checks as a time read from text; a naive one is in the current time zone.
        aware = when if timezone.is_aware(when) else timezone.make_aware(when, timezone.get_current_timezone())
        due = check_due(aware, now=now)
    else:
        due = parse_when(when, now=now)
    text = clean_message(message)
    thread_id = str(thread_id or "")
    if len(thread_id) > 300:
        raise InvalidMemoryArgument("thread_id", "must be at most 300 characters")
    limit = workflow_settings.REMINDER_MAX_PENDING_PER_USER
    with transaction.atomic():
        # The person's row, locked (PostgreSQL): concurrent reminders of one person count one at a time.
        try:
            MemoryService().hold_person(user_id)
        except PersonForgotten:
            raise InvalidMemoryArgument("user", f"no memory user {user_id}") from None
        pending = Reminder.objects.filter(user_id=user_id, status=ReminderStatus.PENDING).count()
        if limit is not None and pending >= limit:
            raise InvalidMemoryArgument("reminders", f"this person already has {pending} pending reminders (the limit)")
        return Reminder.objects.create(
            user_id=user_id, agent_id=agent_id, message=text, due_at=due, next_attempt_at=due, thread_id=thread_id
        )


@dataclass(frozen=True)
class CancelResult:
    cancelled: int
    not_pending: int  # delivered, failed, already cancelled, or being sent right now


def cancel_reminders(ids, *, now=None):
    """Cancel these reminders if still pending and not being sent at this moment (one UPDATE)."""
    ids = list(dict.fromkeys(ids))
    now = now or timezone.now()
    # A reminder a worker holds may be on its way already: cancelling it could not stop the send.
    free = Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)
    cancelled = Reminder.objects.filter(free, pk__in=ids, status=ReminderStatus.PENDING).update(
        status=ReminderStatus.CANCELLED, claimed_by="", claimed_until=None
    )
    return CancelResult(cancelled, len(ids) - cancelled)


def delete_reminders(ids):
    """Delete reminders by id (an operator's choice; a reminder being sent may still arrive)."""
    ids = list(dict.fromkeys(int(i) for i in ids))
    found = set(Reminder.objects.filter(pk__in=ids).values_list("pk", flat=True))
    deleted, _ = Reminder.objects.filter(pk__in=ids).delete()
    return BatchDelete(deleted, [i for i in ids if i not in found])


# ------------------------------------------------------------------ memory's lifecycle


@receiver(users_deleting, dispatch_uid="workflows_reminders_of_deleted_users")
def _users_deleting(sender, user_ids, **kwargs):
    Reminder.objects.filter(user_id__in=list(user_ids)).delete()


@receiver(users_merged, dispatch_uid="workflows_reminders_follow_merge")
def _users_merged(sender, source_id, target_id, **kwargs):
    Reminder.objects.filter(user_id=source_id).update(user_id=target_id)


@receiver(users_footprint, dispatch_uid="workflows_reminders_footprint")
def _users_footprint(sender, user_ids, **kwargs):
    return {"reminders": Reminder.objects.filter(user_id__in=list(user_ids)).aggregate(n=Count("id"))["n"]}


@receiver(person_exporting, dispatch_uid="workflows_reminders_export")
def _person_exporting(sender, user_ids, **kwargs):
    fields = ("agent_id", "message", "due_at", "status", "attempts", "channel", "delivered_at", "created_at")
    return [
        {"kind": "reminder", **row}
        for row in Reminder.objects.filter(user_id__in=list(user_ids)).order_by("pk").values(*fields)
    ]


FINISHED = (ReminderStatus.DELIVERED, ReminderStatus.FAILED, ReminderStatus.CANCELLED)


@receiver(prune_requested, dispatch_uid="workflows_reminders_prune")
def _prune_requested(sender, agent_id=None, dry_run=False, **kwargs):
    """Finished reminders (delivered, failed, cancelled) due more than REMINDER_RETENTION_DAYS ago."""
    days = workflow_settings.REMINDER_RETENTION_DAYS
    if days is None:
        return {}
    old = Reminder.objects.filter(status__in=FINISHED, due_at__lt=timezone.now() - timedelta(days=days))
    if agent_id is not None:
        old = old.filter(agent_id=agent_id)
    return {"reminders": old.count() if dry_run else old.delete()[0]}


# ------------------------------------------------------------------ memory export / import


def _check_imported(row):
    """A file's reminder must be one `schedule_reminder` and delivery could have written."""
    if not row["message"].strip():
        return "message", "must not be blank"
    if len(row["message"]) > MAX_MESSAGE_LENGTH:
        return "message", f"must be at most {MAX_MESSAGE_LENGTH} characters"
    if (row["status"] == ReminderStatus.DELIVERED) != (row["delivered_at"] is not None):
        return "delivered_at", "is set exactly when the status is delivered"
    return None


def _prepare_imported(row):
    # A delivery lease belongs to a worker of the exporting database: here nobody holds it.
    row["claimed_by"], row["claimed_until"] = "", None


register_transfer_kind(
    TransferKind(
        "reminder",
        Reminder,
        derived=("claimed_by", "claimed_until"),
        check=_check_imported,
        prepare=_prepare_imported,
    )
)
