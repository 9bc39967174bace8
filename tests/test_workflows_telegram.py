"""Telegram end to end: Django's live server over real HTTP, a fake Bot API on 127.0.0.1."""

import json
import logging

import httpx
import pytest
from conftest import BOT_TOKEN, WEBHOOK_SECRET
from django.core.management import call_command

from memory.models import Episode, Fact, MemoryUser
from memory.service import MemoryService
from workflows.channels.fake_telegram import telegram_update
from workflows.conversations import threads
from workflows.models import Thread

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = {"X-Telegram-Bot-Api-Secret-Token": WEBHOOK_SECRET}


@pytest.fixture
def post(live_server, demo_workflow, fake_bot):
    """post(update_or_body, headers=SECRET) -> httpx.Response, to the demo workflow's webhook."""
    url = f"{live_server.url}/telegram/{demo_workflow.slug}/webhook/"
    with httpx.Client(timeout=30) as client:

        def send(body, headers=SECRET, raw=False):
            if raw:
                return client.post(url, content=body, headers={**headers, "Content-Type": "application/json"})
            return client.post(url, json=body, headers=headers)

        yield send


def replies(bot, chat_id):
    return [m["text"] for m in bot.sent_messages(chat_id)]


def test_a_returning_user_is_answered_from_memory_and_others_are_not(post, fake_bot, demo_workflow):
    assert post(telegram_update(1, 42, "my name is Ada")).status_code == 200
    assert post(telegram_update(2, 42, "what is my name?")).json()["status"] == "ran"
    answers = replies(fake_bot, 42)
    assert len(answers) == 2 and "Ada" in answers[1]
    ada = MemoryUser.objects.get(canonical_id="telegram:42")
    fact = Fact.objects.get(key="name")
    assert (fact.scope, fact.user_id, fact.value) == ("user", ada.pk, "Ada")
    thread = Thread.objects.get(user=ada, conversation_id="direct", workflow=demo_workflow)
    assert thread.thread_id == f"{ada.pk}:direct:{demo_workflow.pk}"
    assert thread.checkpoint_count > 0 and threads.list_checkpoints(thread.thread_id)

    assert post(telegram_update(3, 43, "what is my name?", first_name="Bob")).status_code == 200
    (answer,) = replies(fake_bot, 43)
    assert "Ada" not in answer


def test_cross_channel_run_sees_the_same_facts_and_continues_the_thread(post, fake_bot, demo_workflow, admin_client):
    post(telegram_update(1, 42, "my name is Ada"))
    ada = MemoryUser.objects.get(canonical_id="telegram:42")
    MemoryService().link_identity(ada.pk, "email", "ada@example.com")
    response = admin_client.post(
        f"/api/v1/workflows/{demo_workflow.slug}/run/",
        {"email": "ada@example.com", "message": "what is my name?"},
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert "Ada" in body["reply"]
    assert body["user"]["id"] == ada.pk and body["user"]["channel"] == "email"
    assert body["thread_id"] == f"{ada.pk}:direct:{demo_workflow.pk}"
    assert Thread.objects.get().channel == "email"  # one thread, continued on the other channel
    newest = threads.list_checkpoints(body["thread_id"], limit=1)[0]
    assert newest.message_count == 4  # the Telegram turn and this one


def test_a_retried_update_runs_once_and_replies_once(post, fake_bot):
    update = telegram_update(7, 42, "my name is Ada")
    first, retry = post(update), post(update)
    assert first.json()["status"] == "ran" and retry.status_code == 200 and retry.json()["status"] == "duplicate"
    assert Episode.objects.count() == 1 and len(replies(fake_bot, 42)) == 1


@pytest.mark.parametrize("headers", [{}, {"X-Telegram-Bot-Api-Secret-Token": "wrong"}])
def test_a_wrong_or_missing_secret_is_refused_and_nothing_runs(post, fake_bot, headers):
    response = post(telegram_update(1, 42, "my name is Ada"), headers=headers)
    assert response.status_code == 403 and "secret_token" in response.json()["errors"]
    assert not Episode.objects.exists() and not MemoryUser.objects.exists() and not fake_bot.calls


def test_malformed_updates_are_acknowledged_as_rejected_naming_the_problem(post, fake_bot):
    """An update that can never succeed is answered 200 (Telegram would retry anything else forever),
    with the problem named, logged, and nothing run or written."""
    response = post(b'{"update_id": 1, "message": ', raw=True)
    assert (
        response.status_code == 200 and response.json()["status"] == "rejected" and "body" in response.json()["errors"]
    )
    response = post({"message": {"text": "no id"}})
    assert response.status_code == 200 and "update_id" in response.json()["errors"]
    bad_sender = telegram_update(2, 42, "hi")
    del bad_sender["message"]["from"]
    response = post(bad_sender)
    assert response.status_code == 200 and "message.from.id" in response.json()["errors"]
    assert not Episode.objects.exists() and not MemoryUser.objects.exists() and not fake_bot.calls


def test_an_update_without_a_message_is_acknowledged_without_a_run(post, fake_bot):
    response = post({"update_id": 5, "my_chat_member": {"chat": {"id": 42}}})
    assert response.status_code == 200 and response.json() == {"ok": True, "status": "ignored"}
    assert not Episode.objects.exists() and not MemoryUser.objects.exists() and not fake_bot.calls


def test_callback_queries_are_answered(post, fake_bot):
    assert post(telegram_update(3, 42, "what is my name?", kind="callback_query")).json()["status"] == "ran"
    methods = [m for _, m, _ in fake_bot.calls]
    assert methods == ["answerCallbackQuery", "sendMessage"]


def test_a_failed_reply_is_reported_without_the_token(live_server, demo_workflow, caplog, settings):
    # The Bot API is unreachable: the run happens, the reply fails and waits in the outbox (503, so
    # Telegram comes back for it), and nothing logs the token.
    settings.WORKFLOWS = {**settings.WORKFLOWS, "TELEGRAM_API_BASE": "http://127.0.0.1:9"}
    with caplog.at_level(logging.DEBUG):
        response = httpx.post(
            f"{live_server.url}/telegram/{demo_workflow.slug}/webhook/",
            json=telegram_update(1, 42, "hello"),
            headers=SECRET,
            timeout=30,
        )
    body = response.json()
    assert response.status_code == 503 and body["status"] == "ran" and body["reply_pending"] is True
    assert body["reply_sent"] is False and "sendMessage" in body["reply_error"]
    assert "reply not sent" in caplog.text
    assert BOT_TOKEN not in caplog.text and BOT_TOKEN not in response.text
    assert Episode.objects.count() == 1


def test_bot_api_requests_are_logged_without_the_token(post, fake_bot, caplog):
    with caplog.at_level(logging.DEBUG):
        assert post(telegram_update(1, 42, "hello")).json()["reply_sent"] is True
    assert "/bot<token>/sendMessage" in caplog.text  # httpx logs the request, redacted
    assert BOT_TOKEN not in caplog.text


def test_an_unknown_workflow_is_404(live_server, db):
    response = httpx.post(f"{live_server.url}/telegram/nope/webhook/", json={"update_id": 1}, headers=SECRET)
    assert response.status_code == 404


def test_a_deactivated_workflow_is_404_and_runs_nothing(post, fake_bot, demo_workflow):
    demo_workflow.is_active = False
    demo_workflow.save()
    response = post(telegram_update(1, 42, "my name is Ada"))
    assert response.status_code == 404 and response.json()["errors"]["slug"]
    assert not Episode.objects.exists() and fake_bot.sent_messages() == []


def test_telegram_poll_handles_queued_updates_once(fake_bot, demo_workflow, capsys):
    fake_bot.queue_update(telegram_update(10, 42, "my name is Ada"))
    fake_bot.queue_update(telegram_update(11, 42, "what is my name?"))
    call_command("telegram_poll", demo_workflow.slug, "--once")
    answers = replies(fake_bot, 42)
    assert len(answers) == 2 and "Ada" in answers[1]
    call_command("telegram_poll", demo_workflow.slug, "--once")  # confirmed: nothing comes back
    assert len(replies(fake_bot, 42)) == 2
    assert Episode.objects.count() == 2
    out = capsys.readouterr().out
    assert "update 10: ran (reply sent)" in out and BOT_TOKEN not in out


def test_seen_updates_are_forgotten_after_the_retention(fake_bot, demo_workflow):
    from datetime import timedelta

    from django.utils import timezone

    from workflows.channels.telegram import handle_update
    from workflows.models import TelegramUpdate

    handle_update(demo_workflow, telegram_update(1, 42, "hello"))
    TelegramUpdate.objects.update(received_at=timezone.now() - timedelta(hours=49))
    handle_update(demo_workflow, telegram_update(1000, 42, "hello again"))  # every 1,000th cleans up
    assert list(TelegramUpdate.objects.values_list("update_id", flat=True)) == [1000]
    assert handle_update(demo_workflow, telegram_update(1000, 42, "hello again")).status == "duplicate"


def test_without_a_bot_token_the_update_is_left_for_telegrams_retry(post, fake_bot, settings):
    """The reply could never be sent: answer 503 before running, recording nothing, so Telegram's retry
    (after the operator sets the token) runs it — not "duplicate"."""
    settings.WORKFLOWS = {**settings.WORKFLOWS, "TELEGRAM_BOT_TOKEN": ""}
    response = post(telegram_update(11, 42, "my name is Ada"))
    assert response.status_code == 503 and "bot_token" in response.json()["errors"]
    assert not MemoryUser.objects.exists() and not Episode.objects.exists()
    settings.WORKFLOWS = {**settings.WORKFLOWS, "TELEGRAM_BOT_TOKEN": BOT_TOKEN}
    retry = post(telegram_update(11, 42, "my name is Ada"))
    assert retry.status_code == 200 and retry.json()["status"] == "ran"


def test_a_webhook_secret_without_a_bot_token_fails_the_system_check(settings):
    from django.core.checks import run_checks

    settings.WORKFLOWS = {**settings.WORKFLOWS, "TELEGRAM_BOT_TOKEN": ""}
    assert [m.id for m in run_checks()] == ["workflows.E001"]
    settings.WORKFLOWS = {**settings.WORKFLOWS, "TELEGRAM_BOT_TOKEN": BOT_TOKEN}
    assert run_checks() == []


@pytest.mark.django_db
def test_nul_and_lone_surrogates_in_a_telegram_text_are_rejected_alike_on_every_database(
    client, demo_workflow, fake_bot
):
    """PostgreSQL cannot store U+0000 (SQLite can) and nothing can encode a lone surrogate: both are
    refused before the run, the same on both databases, acknowledged so Telegram does not retry."""
    for n, text in enumerate(['"a\\u0000b"', '"hi \\ud800"']):
        body = json.dumps(telegram_update(20 + n, 42, "PLACEHOLDER")).replace('"PLACEHOLDER"', text)
        response = client.post(
            f"/telegram/{demo_workflow.slug}/webhook/",
            body,
            content_type="application/json",
            headers={"X-Telegram-Bot-Api-Secret-Token": WEBHOOK_SECRET},
        )
        assert response.status_code == 200 and response.json()["status"] == "rejected"
        assert "message.text" in response.json()["errors"]
    assert not MemoryUser.objects.exists() and not Episode.objects.exists() and not fake_bot.calls
