"""Reminders: the `remind` tool, the delivery worker against the fake Bot API (real HTTP), the admin tab, forgetting.

Transactional: the worker claims and records in transactions of its own, outside any test transaction,
and LangGraph's ToolNode runs tools in worker threads with their own connections.
"""

import io
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from test_agent_tools import run_agent

from memory.exceptions import InvalidMemoryArgument
from memory.models import MemoryUser
from workflows import langgraph as engram
from workflows.channels.delivery import claim, deliver_due, destinations
from workflows.conversations.reminders import PAST_TOLERANCE, cancel_reminders, parse_when, schedule_reminder
from workflows.language.definition import validate_definition
from workflows.models import Reminder, ReminderStatus, Thread

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ada(service):
    user, _ = service.get_or_create_user("telegram", "4242", display_name="Ada")
    return user


def due(user, message="drink water", *, ago=60, **fields):
    """A reminder that fell due `ago` seconds ago (the tool refuses past times, so it is written directly)."""
    at = timezone.now() - timedelta(seconds=ago)
    return Reminder.objects.create(user=user, agent_id="bot", message=message, due_at=at, next_attempt_at=at, **fields)


def worker(*args):
    out = io.StringIO()
    call_command("memory", "reminders", "--once", "--json", *args, stdout=out)
    return json.loads(out.getvalue())


# ------------------------------------------------------------------ the tool


def test_remind_reads_natural_and_iso_times_for_the_identified_user(ada):
    now = timezone.now()
    iso = (now + timedelta(days=3)).replace(microsecond=0)
    replies = run_agent(
        engram.memory_tools(agent_id="bot", user_id=ada.pk, names=["remind"]),
        ("remind", {"when": "in 2 hours", "message": "stretch your legs"}),
        ("remind", {"when": "tomorrow at 9am", "message": "call the dentist"}),
        ("remind", {"when": iso.isoformat(), "message": "pay rent"}),
    )
    assert [status for _, status in replies] == ["success"] * 3
    stretch, dentist, rent = Reminder.objects.order_by("pk")
    assert (
        replies[0][0]
        == f"Reminder:{stretch.pk} set for {timezone.localtime(stretch.due_at).isoformat(timespec='minutes')}."
    )
    assert abs(stretch.due_at - (now + timedelta(hours=2))) < timedelta(minutes=1)
    local = timezone.localtime(dentist.due_at)
    assert (local.date(), local.hour, local.minute) == (timezone.localdate(now) + timedelta(days=1), 9, 0)
    assert rent.due_at == iso
    for reminder in (stretch, dentist, rent):
        assert (reminder.user_id, reminder.agent_id, reminder.status) == (ada.pk, "bot", ReminderStatus.PENDING)
        assert reminder.next_attempt_at == reminder.due_at and reminder.attempts == 0


@pytest.mark.parametrize(
    "when, message, field",
    [
        ("yesterday", "too late", "when"),
        ("2001-01-01T09:00:00+00:00", "too late", "when"),
        ("when pigs fly", "never", "when"),
        ("", "no time", "when"),
        ("in 500 days", "too far", "when"),
        ("in 2 hours", "   ", "message"),
    ],
)
def test_remind_refuses_past_unreadable_or_blank_input_and_writes_nothing(ada, when, message, field):
    ((text, status),) = run_agent(
        engram.memory_tools(agent_id="bot", user_id=ada.pk, names=["remind"]),
        ("remind", {"when": when, "message": message}),
    )
    assert status == "error" and f"remind failed: {field}: " in text
    assert not Reminder.objects.exists()


@pytest.mark.parametrize(
    "when, named", [("tomorrow at 25:00", "25:00"), ("tomorrow at 9:60", "9:60"), ("friday 13pm", "13pm")]
)
def test_remind_refuses_a_time_of_day_that_does_not_exist(ada, when, named):
    # dateparser alone reads "tomorrow at 25:00" as tomorrow at this very hour.
    ((text, status),) = run_agent(
        engram.memory_tools(agent_id="bot", user_id=ada.pk, names=["remind"]),
        ("remind", {"when": when, "message": "call the dentist"}),
    )
    assert status == "error" and f"remind failed: when: {named!r} in {when!r} is not a time of day" in text
    assert not Reminder.objects.exists()


def test_parse_when_refuses_a_time_of_day_it_could_not_read():
    with pytest.raises(InvalidMemoryArgument, match="when: could not read the time of day '7.30am'"):
        parse_when("tomorrow at 7.30am")
    local = timezone.localtime(parse_when("tomorrow at 12:30 pm"))
    assert (local.hour, local.minute) == (12, 30)


@pytest.mark.parametrize(
    "offset, problem",
    [(timedelta(days=-400), "which is not in the future"), (None, "more than 366 days ahead")],
    ids=["400-days-past", "year-9999"],
)
@pytest.mark.parametrize("aware", [True, False], ids=["aware", "naive"])
def test_schedule_reminder_checks_a_datetime_as_it_checks_text(ada, offset, problem, aware):
    now = timezone.now()
    when = now + offset if offset is not None else now.replace(year=9999)
    if not aware:
        when = timezone.make_naive(when)
    with pytest.raises(InvalidMemoryArgument, match=f"^when: .*{problem}") as caught:
        schedule_reminder(user_id=ada.pk, when=when, message="too late or too far")
    assert caught.value.field == "when"
    assert not Reminder.objects.exists()
    assert worker()["delivered"] == 0  # nothing is delivered at once


def test_schedule_reminder_takes_an_aware_datetime_in_range_or_just_past(ada):
    now = timezone.now()
    soon = schedule_reminder(user_id=ada.pk, when=now + timedelta(days=2), message="soon")
    just_past = schedule_reminder(user_id=ada.pk, when=now - timedelta(seconds=20), message="now-ish")
    assert soon.due_at == now + timedelta(days=2) and just_past.due_at == now - timedelta(seconds=20)
    with pytest.raises(InvalidMemoryArgument, match="when: "):
        schedule_reminder(user_id=ada.pk, when=now - PAST_TOLERANCE - timedelta(seconds=5), message="too late")


def test_remind_without_an_identified_user_refuses(db):
    ((text, status),) = run_agent(
        engram.memory_tools(agent_id="bot", names=["remind"]), ("remind", {"when": "in 1 hour", "message": "x"})
    )
    assert status == "error" and "user: nobody is identified" in text
    assert not Reminder.objects.exists()


def test_pending_reminders_per_person_are_limited(ada, settings):
    settings.WORKFLOWS = {**settings.WORKFLOWS, "REMINDER_MAX_PENDING_PER_USER": 2}
    for n in range(2):
        schedule_reminder(user_id=ada.pk, when="in 1 hour", message=f"n{n}")
    with pytest.raises(Exception, match="reminders: this person already has 2 pending"):
        schedule_reminder(user_id=ada.pk, when="in 1 hour", message="one more")
    assert Reminder.objects.count() == 2
    with pytest.raises(Exception, match="user: no memory user 999999"):
        schedule_reminder(user_id=999999, when="in 1 hour", message="nobody")


def test_parse_when_reads_naive_iso_in_the_current_time_zone(settings):
    settings.TIME_ZONE = "Asia/Kolkata"  # +05:30 all year
    now = timezone.now()
    day = (now + timedelta(days=30)).date().isoformat()
    assert parse_when(f"{day} 09:30", now=now).isoformat() == f"{day}T09:30:00+05:30"
    assert parse_when(f"{day}T09:30:00Z", now=now).isoformat() == f"{day}T09:30:00+00:00"


def test_an_agent_node_enables_remind_like_the_other_tools():
    definition = {
        "nodes": [{"id": "agent", "type": "agent", "config": {"tools": {"remind": {}, "recall": {}}}}],
        "edges": [{"source": "START", "target": "agent"}],
    }
    validate_definition(definition)
    with pytest.raises(Exception, match="remind"):
        validate_definition(
            {**definition, "nodes": [{**definition["nodes"][0], "config": {"tools": {"remind": {"x": 1}}}}]}
        )


# ------------------------------------------------------------------ the worker


def test_the_worker_delivers_due_reminders_once_and_not_early(ada, fake_bot):
    first, second = due(ada, "drink water"), due(ada, "take a break", ago=5)
    later = schedule_reminder(user_id=ada.pk, when="in 1 hour", message="not yet")
    assert worker()["delivered"] == 2
    assert [m["text"] for m in fake_bot.sent_messages(4242)] == ["Reminder: drink water", "Reminder: take a break"]
    for reminder in (first, second):
        reminder.refresh_from_db()
        assert reminder.status == ReminderStatus.DELIVERED and reminder.attempts == 1
        assert (reminder.channel, reminder.destination, reminder.claimed_by) == ("telegram", "4242", "")
        assert reminder.delivered_at is not None
    assert worker()["delivered"] == 0  # nothing twice, nothing early
    assert len(fake_bot.sent_messages()) == 2
    later.refresh_from_db()
    assert later.status == ReminderStatus.PENDING and later.attempts == 0


def test_delivery_goes_to_the_deliverable_channel_the_person_used_last(service, fake_bot, demo_workflow):
    ada, _ = service.get_or_create_user("chat", "ada", display_name="Ada")
    service.link_identity(ada.pk, "telegram", "77")
    now = timezone.now()
    for n, channel in enumerate(["telegram", "chat"]):  # chat is the latest, but has no push API
        Thread.objects.create(
            thread_id=f"t{n}",
            workflow=demo_workflow,
            user=ada,
            conversation_id=f"c{n}",
            channel=channel,
            last_activity=now - timedelta(minutes=10 - n),
        )
    bob, _ = service.get_or_create_user("chat", "bob")  # nowhere to send to
    assert destinations([ada.pk, bob.pk]) == {ada.pk: ("telegram", "77")}
    due(ada, "for ada")
    his = due(bob, "for bob")
    report = deliver_due()
    assert (report.delivered, report.retried) == (1, 1)
    assert [m["chat_id"] for m in fake_bot.sent_messages()] == [77]
    his.refresh_from_db()
    assert his.status == ReminderStatus.PENDING and "no channel to deliver to" in his.last_error


def test_a_failing_bot_api_is_retried_with_backoff_then_the_reminder_fails(ada, fake_bot, settings):
    settings.WORKFLOWS = {
        **settings.WORKFLOWS,
        "TELEGRAM_API_BASE": fake_bot.url,
        "REMINDER_MAX_ATTEMPTS": 3,
        "REMINDER_BACKOFF_SECONDS": 60,
    }
    reminder = due(ada)
    fake_bot.fail_sends(5)
    waits = []
    for attempt in (1, 2):
        before = timezone.now()
        report = deliver_due()
        assert report.retried == 1
        reminder.refresh_from_db()
        assert reminder.status == ReminderStatus.PENDING and reminder.attempts == attempt
        assert (
            "HTTP 502: Bad Gateway" in reminder.last_error
            and settings.WORKFLOWS["TELEGRAM_BOT_TOKEN"] not in reminder.last_error
        )
        waits.append(round((reminder.next_attempt_at - before).total_seconds()))
        assert deliver_due().claimed == 0  # not before its backoff
        Reminder.objects.filter(pk=reminder.pk).update(next_attempt_at=timezone.now())
    assert waits == [60, 120]
    assert deliver_due().failed == 1
    reminder.refresh_from_db()
    assert (reminder.status, reminder.attempts) == (ReminderStatus.FAILED, 3)
    assert "502" in reminder.last_error and fake_bot.sent_messages() == []
    assert deliver_due().claimed == 0


def test_a_crashed_workers_claims_are_taken_again_after_the_lease(ada, fake_bot):
    reminder = due(ada)
    (held,) = claim("crashed-worker#1", batch=10, lease=120)  # claimed, then the process died
    assert held.pk == reminder.pk
    assert deliver_due().claimed == 0 and fake_bot.sent_messages() == []
    Reminder.objects.filter(pk=reminder.pk).update(claimed_until=timezone.now() - timedelta(seconds=1))
    assert deliver_due().delivered == 1
    assert len(fake_bot.sent_messages()) == 1


def test_a_lease_too_short_for_a_send_is_refused(ada):
    with pytest.raises(CommandError, match="lease: 5 s is too short"):
        worker("--lease", "5")


def test_two_claimers_never_claim_the_same_reminder(ada, run_in_threads):
    ids = {due(ada, f"r{n}").pk for n in range(120)}

    def claimer(n):
        mine = []
        while batch := claim(f"claimer-{n}#{len(mine)}", batch=7, lease=300):
            mine += [r.pk for r in batch]
        return mine

    claimed = [pk for got in run_in_threads(claimer, 4) for pk in got]
    assert len(claimed) == len(set(claimed)) == 120 and set(claimed) == ids


def test_a_claim_skips_rows_another_claim_has_locked_on_postgresql(ada, capture_data_queries, requires_postgres):
    due(ada)
    with capture_data_queries() as q:
        claim("w#1", batch=5, lease=300)
    assert "FOR UPDATE SKIP LOCKED" in q.data[0]


def test_the_worker_loop_stops_when_asked(ada, fake_bot):
    import threading

    from workflows.channels.delivery import run_worker

    due(ada)
    stop = threading.Event()
    rounds = []

    def on_round(report, total):
        rounds.append(report.claimed)
        if report.claimed == 0:
            stop.set()

    total = run_worker(poll=0.05, stop=stop, on_round=on_round)
    assert total.delivered == 1 and rounds[0] == 1


# ------------------------------------------------------------------ operators and forgetting


REMINDERS = "/memories/workflows/reminder/"


def test_the_reminders_tab_lists_filters_and_cancels(ada, staff_client):
    pending, sending = due(ada, "pending one"), due(ada, "being sent")
    delivered = due(ada, "done", status=ReminderStatus.DELIVERED)
    claim("worker#1", batch=1, lease=300)  # takes `pending`, the oldest
    Reminder.objects.filter(pk=pending.pk).update(claimed_by="", claimed_until=None)
    Reminder.objects.filter(pk=sending.pk).update(
        claimed_by="worker#2", claimed_until=timezone.now() + timedelta(minutes=1)
    )
    html = staff_client.get(REMINDERS, {"status__exact": "pending"}).content.decode()
    assert "pending one" in html and "being sent" in html and "done" not in html
    data = {
        "action": "cancel_selected",
        "index": "0",
        "_selected_action": [str(r.pk) for r in (pending, sending, delivered)],
    }
    response = staff_client.post(REMINDERS, data, follow=True)
    assert "Cancelled 1 reminder." in response.content.decode()
    statuses = dict(Reminder.objects.values_list("pk", "status"))
    assert statuses == {pending.pk: "cancelled", sending.pk: "pending", delivered.pk: "delivered"}
    page = staff_client.get(f"/memories/memory/memoryuser/{ada.pk}/change/").content.decode()
    assert 'id="user-reminders"' in page and "being sent" in page


def test_cancel_reminders_skips_what_is_not_pending(ada):
    a, b = due(ada), due(ada, status=ReminderStatus.FAILED)
    result = cancel_reminders([a.pk, b.pk, 999999])
    assert (result.cancelled, result.not_pending) == (1, 2)


def test_forgetting_a_person_deletes_their_reminders_and_merging_moves_them(ada, service):
    bob, _ = service.get_or_create_user("telegram", "5151", display_name="Bob")
    alias, _ = service.get_or_create_user("email", "ada@example.org")
    schedule_reminder(user_id=ada.pk, when="in 1 hour", message="ada's")
    schedule_reminder(user_id=alias.pk, when="in 1 hour", message="alias's")
    schedule_reminder(user_id=bob.pk, when="in 1 hour", message="bob's")
    service.merge_users(alias.pk, ada.pk)
    assert set(Reminder.objects.filter(user=ada).values_list("message", flat=True)) == {"ada's", "alias's"}
    assert service.user_footprint([ada.pk])["reminders"] == 2
    service.delete_users([ada.pk], cascade=True)
    assert list(Reminder.objects.values_list("message", flat=True)) == ["bob's"]
    assert not MemoryUser.objects.filter(pk=ada.pk).exists()


def test_the_rest_api_lists_filters_cancels_and_deletes_reminders(ada, service, api):
    bob, _ = service.get_or_create_user("telegram", "5151")
    mine, done, his = due(ada, "mine"), due(ada, "done", status=ReminderStatus.DELIVERED), due(bob, "his")
    body = api.get("/api/v1/reminders/", {"user": ada.pk, "status": "pending"}).json()
    assert [r["id"] for r in body["results"]] == [mine.pk] and body["results"][0]["message"] == "mine"
    assert api.get("/api/v1/reminders/", {"status": "soon"}).status_code == 400
    response = api.post("/api/v1/reminders/cancel/", {"ids": [mine.pk, done.pk]}, format="json")
    assert response.json() == {"cancelled": 1, "not_pending": 1}
    assert api.post("/api/v1/reminders/cancel/", {"ids": ["x"]}, format="json").status_code == 400
    response = api.post("/api/v1/reminders/batch-delete/", {"ids": [his.pk, 999999]}, format="json")
    assert response.json() == {"deleted": 1, "not_found": [999999]}
    assert api.delete(f"/api/v1/reminders/{done.pk}/").status_code == 204
    assert api.get("/api/v1/reminders/abc/").status_code == 404
    assert list(Reminder.objects.values_list("status", flat=True)) == ["cancelled"]


def test_memory_prune_deletes_finished_reminders_past_the_retention(ada, service, settings):
    keep = [due(ada, "pending, long ago", ago=90 * 86400), due(ada, "recent", status=ReminderStatus.DELIVERED)]
    old = [due(ada, f"old {s}", ago=40 * 86400, status=s) for s in ("delivered", "failed", "cancelled")]
    assert "reminders" not in service.prune().deleted  # kept, unless a retention is set
    settings.WORKFLOWS = {**settings.WORKFLOWS, "REMINDER_RETENTION_DAYS": 30}
    assert service.prune(dry_run=True).deleted["reminders"] == 3 and Reminder.objects.count() == 5
    assert service.prune(agent_id="other").deleted["reminders"] == 0
    assert service.prune().deleted["reminders"] == len(old)
    assert set(Reminder.objects.values_list("pk", flat=True)) == {r.pk for r in keep}
