"""Reminders in `memory export` / `memory import`: a round trip keeps every row; a bad row is named, nothing written."""

import io
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from memory.exceptions import ImportRejected
from memory.models import MemoryUser
from workflows.conversations.reminders import schedule_reminder
from workflows.models import Reminder, ReminderStatus

pytestmark = pytest.mark.django_db


def rows():
    return [
        tuple(getattr(r, f.attname) for f in Reminder._meta.concrete_fields) for r in Reminder.objects.order_by("pk")
    ]


@pytest.fixture
def reminders(service, user_factory):
    ada, bob = user_factory("ada"), user_factory("bob")
    now = timezone.now()
    pending = schedule_reminder(user_id=ada.pk, when=now + timedelta(hours=2), message="drink water ✓", agent_id="bot")
    delivered = schedule_reminder(user_id=bob.pk, when=now + timedelta(hours=1), message="call home")
    Reminder.objects.filter(pk=delivered.pk).update(
        status=ReminderStatus.DELIVERED, attempts=2, channel="telegram", destination="42", delivered_at=now
    )
    return {"ada": ada, "pending": pending}


def export_text(service):
    out = io.StringIO()
    service.export_memories(out)
    return out.getvalue()


def reminder_line(text, message):
    for n, line in enumerate(text.splitlines(), start=1):
        row = json.loads(line)
        if row.get("kind") == "reminder" and row["message"] == message:
            return n, row
    raise AssertionError(message)


def test_export_clear_import_reproduces_every_reminder(service, reminders):
    before = rows()
    text = export_text(service)
    assert json.loads(text.splitlines()[0])["counts"]["reminder"] == 2
    _, row = reminder_line(text, "drink water ✓")
    assert (row["id"], row["user_id"], row["status"]) == (reminders["pending"].pk, reminders["ada"].pk, "pending")
    assert "claimed_by" not in row and "claimed_until" not in row  # a worker's lease is not memory
    service.clear_memories()
    assert not Reminder.objects.exists() and not MemoryUser.objects.exists()
    report = service.import_memories(io.StringIO(text))
    assert report.added["reminder"] == 2
    assert rows() == before
    # Importing again adds nothing; a row already present is left as the database has it.
    Reminder.objects.filter(pk=reminders["pending"].pk).update(status=ReminderStatus.CANCELLED)
    report = service.import_memories(io.StringIO(text))
    assert (report.added["reminder"], report.present["reminder"]) == (0, 2)
    assert Reminder.objects.get(pk=reminders["pending"].pk).status == ReminderStatus.CANCELLED
    # New reminders get ids after the imported ones (PostgreSQL sequences moved on).
    later = schedule_reminder(user_id=reminders["ada"].pk, when=timezone.now() + timedelta(days=1), message="again")
    assert later.pk > max(r[0] for r in before)


def test_an_imported_reminder_is_free_to_claim(service, reminders):
    Reminder.objects.update(claimed_by="worker-1", claimed_until=timezone.now() + timedelta(minutes=5))
    text = export_text(service)
    service.clear_memories()
    service.import_memories(io.StringIO(text))
    assert set(Reminder.objects.values_list("claimed_by", "claimed_until")) == {("", None)}


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("message", "   ", "must not be blank"),
        ("message", "x" * 2001, "at most 2000"),
        ("status", "snoozed", "must be one of"),
        ("due_at", "tomorrow", "is not an ISO 8601 timestamp"),
        ("attempts", -1, "must be positive"),
        ("user_id", 9999, "no user 9999 in the file or the database"),
        ("delivered_at", "2024-01-01T10:00:00+00:00", "exactly when the status is delivered"),
        ("claimed_by", "worker-1", "is not a column of reminder"),
    ],
)
def test_a_bad_reminder_is_named_with_its_line_and_nothing_is_written(service, reminders, field, value, message):
    text = export_text(service)
    service.clear_memories()
    n, row = reminder_line(text, "drink water ✓")
    lines = text.splitlines()
    lines[n - 1] = json.dumps({**row, field: value})
    with pytest.raises(ImportRejected) as info:
        service.import_memories(io.StringIO("\n".join(lines) + "\n"))
    assert (info.value.errors[0][0], info.value.errors[0][1]) == (n, field), info.value.errors
    assert message in info.value.errors[0][2]
    assert not Reminder.objects.exists() and not MemoryUser.objects.exists()
