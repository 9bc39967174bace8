"""Reminders through any channel (workflows/channels/sending.py): back to the conversation they were set
in, on its channel (Telegram, or the workflow's webhook URL, a real local HTTP server here), and into
that conversation's thread, so the next turn sees them."""

import hashlib
import hmac
import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone
from langchain_core.messages import AIMessage
from test_workflows_agent import MODEL_CALLS, call, fake_model, make_workflow, without_memory  # noqa: F401

from workflows.channels import sending
from workflows.channels.delivery import claim, deliver_due, routes
from workflows.channels.fake_telegram import telegram_update
from workflows.conversations.checkpointer import get_checkpointer
from workflows.exceptions import InvalidDefinition
from workflows.graph.agent import write_to_thread
from workflows.graph.runtime import run_workflow
from workflows.language.definition import validate_definition
from workflows.models import Reminder, ReminderStatus

pytestmark = pytest.mark.django_db(transaction=True)


class Receiver:
    """A webhook receiver on 127.0.0.1: records each POST (headers, JSON body); answers `statuses` in
    turn, then 200."""

    def __init__(self):
        self.posts, self.statuses = [], []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.posts.append({"headers": dict(self.headers), "raw": raw, "body": json.loads(raw)})
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/reminders"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


def remind_then(*replies):
    return [call("remind", {"when": "in 1 hour", "message": "stretch your legs"}, "r1"), *replies]


def make_due():
    now = timezone.now() - timedelta(seconds=1)
    Reminder.objects.update(due_at=now, next_attempt_at=now)


def history(thread_id):
    saved = get_checkpointer().get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
    return [(m.type, m.content) for m in saved.checkpoint["channel_values"]["messages"]]


def test_a_reminder_set_on_telegram_goes_back_there_and_into_the_conversation(fake_model, fake_bot):  # noqa: F811
    workflow = make_workflow(tools={"remind": {}})
    fake_model(remind_then(AIMessage(content="I will remind you."), AIMessage(content="Welcome back.")))
    first = run_workflow(workflow, {"type": "telegram", "payload": telegram_update(1, 42, "remind me in an hour")})
    reminder = Reminder.objects.get()
    assert reminder.thread_id == first.thread_id
    make_due()

    report = deliver_due()
    assert (report.delivered, report.threaded) == (1, 1)
    assert [m["text"] for m in fake_bot.sent_messages(42)] == ["Reminder: stretch your legs"]
    reminder.refresh_from_db()
    assert (reminder.status, reminder.channel, reminder.destination) == (ReminderStatus.DELIVERED, "telegram", "42")
    assert history(first.thread_id)[-1] == ("ai", "Reminder: stretch your legs")

    # The next turn continues a conversation that holds the reminder, after the agent's own answer.
    run_workflow(workflow, {"type": "telegram", "payload": telegram_update(2, 42, "done, thanks")})
    seen = [(m.type, m.content) for m in without_memory(MODEL_CALLS[-1]) if m.type in ("human", "ai")]
    assert seen[-3:] == [
        ("ai", "I will remind you."),
        ("ai", "Reminder: stretch your legs"),
        ("human", "done, thanks"),
    ]


def webhook_workflow(url, slug="hooked"):
    workflow = make_workflow(slug, tools={"remind": {}})
    workflow.definition = {**workflow.definition, "triggers": {"webhook": {"reminder_url": url}}}
    workflow.save()
    return workflow


def test_a_reminder_set_over_the_webhook_is_posted_to_the_workflows_url(fake_model, receiver, settings):  # noqa: F811
    workflow = webhook_workflow(receiver.url)
    fake_model(remind_then(AIMessage(content="Will do.")))
    run = run_workflow(
        workflow, {"type": "webhook", "payload": {"user_id": "cust-7", "message": "ping me", "conversation_id": "c9"}}
    )
    settings.WORKFLOWS = {**settings.WORKFLOWS, "REMINDER_WEBHOOK_SECRET": "s3cret"}
    reminder = Reminder.objects.get()
    make_due()
    receiver.statuses = [503]  # the receiver is unwell once: retried with backoff, like a Bot API failure

    report = deliver_due()
    assert (report.retried, report.delivered, report.threaded) == (1, 0, 0)
    reminder.refresh_from_db()
    assert reminder.status == ReminderStatus.PENDING and "HTTP 503" in reminder.last_error
    Reminder.objects.update(next_attempt_at=timezone.now())
    report = deliver_due()
    assert (report.delivered, report.threaded) == (1, 1)

    assert len(receiver.posts) == 2
    post = receiver.posts[-1]
    assert post["body"] == {
        "type": "reminder",
        "text": "Reminder: stretch your legs",
        "reference": f"reminder:{reminder.pk}",
        "workflow": "hooked",
        "channel": "webhook",
        "user_id": "cust-7",
        "conversation_id": "c9",
        "thread_id": run.thread_id,
    }
    assert post["headers"]["Idempotency-Key"] == f"reminder:{reminder.pk}"
    signature = hmac.new(b"s3cret", post["raw"], hashlib.sha256).hexdigest()
    assert post["headers"]["X-Engram-Signature"] == f"sha256={signature}"
    reminder.refresh_from_db()
    assert (reminder.status, reminder.channel, reminder.destination) == (
        ReminderStatus.DELIVERED,
        "webhook",
        receiver.url,
    )
    assert history(run.thread_id)[-1] == ("ai", "Reminder: stretch your legs")


def test_a_workers_crash_after_a_send_repeats_it_once_with_the_same_key_and_one_message_in_the_thread(
    fake_model,  # noqa: F811
    receiver,
):
    workflow = webhook_workflow(receiver.url)
    fake_model(remind_then(AIMessage(content="Will do.")))
    run = run_workflow(workflow, {"type": "webhook", "payload": {"user_id": "cust-7", "message": "ping me"}})
    make_due()
    # A worker claims it, sends it, writes it into the thread, and dies before recording the outcome.
    (held,) = claim("crashed-worker#1", batch=10, lease=120)
    channel, address = routes([held])[held.pk]
    assert channel.send("Reminder: stretch your legs", address).ok
    write_to_thread(run.thread_id, AIMessage(content="Reminder: stretch your legs", id=f"reminder-{held.pk}"))
    assert deliver_due().claimed == 0  # held until the lease passes
    Reminder.objects.update(claimed_until=timezone.now() - timedelta(seconds=1))

    assert deliver_due().delivered == 1
    assert deliver_due().claimed == 0  # and never again
    assert [p["headers"]["Idempotency-Key"] for p in receiver.posts] == [f"reminder:{held.pk}"] * 2
    assert history(run.thread_id).count(("ai", "Reminder: stretch your legs")) == 1


def test_a_conversation_without_a_push_channel_or_url_is_reached_on_telegram(fake_model, fake_bot, service):  # noqa: F811
    workflow = make_workflow(tools={"remind": {}})
    fake_model(remind_then(AIMessage(content="Will do.")))
    run_workflow(workflow, {"type": "chat", "payload": {"user_id": "ada", "message": "ping me"}})
    reminder = Reminder.objects.get()
    make_due()
    assert deliver_due().retried == 1  # chat has no push API, the workflow no URL, Ada no Telegram id
    reminder.refresh_from_db()
    assert "no channel to deliver to: none of telegram, webhook reaches the person" in reminder.last_error
    service.link_identity(reminder.user_id, "telegram", "77")
    Reminder.objects.update(next_attempt_at=timezone.now())
    report = deliver_due()
    assert (report.delivered, report.threaded) == (1, 1)
    assert [m["chat_id"] for m in fake_bot.sent_messages()] == [77]


def test_a_channel_registered_by_a_project_is_used_for_its_conversations(fake_model, monkeypatch):  # noqa: F811
    sent = []

    class Sms:
        name = "sms"

        def address(self, person, thread):
            number = person.identities.get("sms")
            return sending.Address(to=number, channel="sms") if number and thread is not None else None

        def send(self, text, address):
            sent.append((text, address.to, address.reference))
            return sending.DeliveryResult(True)

    monkeypatch.setitem(sending.CHANNELS, "sms", Sms())
    workflow = make_workflow(tools={"remind": {}})
    fake_model(remind_then(AIMessage(content="Will do.")))
    run_workflow(workflow, {"type": "chat", "payload": {"user_id": "+4912345", "message": "hi", "channel": "sms"}})
    reminder = Reminder.objects.get()
    make_due()
    assert deliver_due().delivered == 1
    assert sent == [("Reminder: stretch your legs", "+4912345", f"reminder:{reminder.pk}")]


@pytest.mark.parametrize(
    "triggers, field",
    [
        ({"webhook": {"reminder_url": "ftp://example.com/x"}}, "triggers.webhook.reminder_url"),
        ({"webhook": {"reminder_url": "https://example.com/" + "x" * 300}}, "triggers.webhook.reminder_url"),
        ({"webhook": {"url": "https://example.com"}}, "triggers.webhook"),
        ({"telegram": {}}, "triggers"),
    ],
)
def test_a_workflows_trigger_settings_are_checked(triggers, field):
    definition = {"nodes": [{"id": "who", "type": "identify_user"}], "edges": [], "triggers": triggers}
    with pytest.raises(InvalidDefinition) as caught:
        validate_definition(definition)
    assert caught.value.field == field
