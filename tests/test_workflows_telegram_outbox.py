"""No lost Telegram message: a run that died is run again on the retry, and replies go through an outbox.

Over real HTTP (Django's live server) to the demo workflow; the fake Bot API is a real server on
127.0.0.1 that can refuse connections (`go_down`) and come back; the delivery worker is the real
`manage.py memory reminders` command.
"""

import io
import json
import time
from datetime import timedelta

import httpx
import pytest
from conftest import BOT_TOKEN, WEBHOOK_SECRET
from django.core.management import call_command
from django.utils import timezone

from memory.models import Episode, MemoryUser
from memory.service import MemoryService
from workflows.channels import claims
from workflows.channels.fake_telegram import telegram_update
from workflows.models import ReplyStatus, TelegramReply, TelegramUpdate, UpdateStatus

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = {"X-Telegram-Bot-Api-Secret-Token": WEBHOOK_SECRET}


@pytest.fixture
def post(live_server, demo_workflow, fake_bot):
    url = f"{live_server.url}/telegram/{demo_workflow.slug}/webhook/"
    with httpx.Client(timeout=30) as client:
        yield lambda update: client.post(url, json=update, headers=SECRET)


@pytest.fixture
def short_backoff(settings):
    """Retries after 0.5 s, 1 s, 2 s…, so that a test waits out the backoff quickly."""
    settings.WORKFLOWS = {**settings.WORKFLOWS, "TELEGRAM_REPLY_BACKOFF_SECONDS": 0.5}


def worker():
    out = io.StringIO()
    call_command("memory", "reminders", "--once", "--json", stdout=out)
    return json.loads(out.getvalue())


def replies(bot, chat_id=42):
    return [m["text"] for m in bot.sent_messages(chat_id)]


def test_a_reply_the_bot_api_refused_is_sent_once_by_telegrams_retry(post, fake_bot):
    fake_bot.go_down()
    first = post(telegram_update(1, 42, "my name is Ada"))
    # The run happened; its reply waits in the outbox, and 503 makes Telegram come back.
    assert first.status_code == 503 and first.json()["status"] == "ran" and first.json()["reply_pending"] is True
    retry = post(telegram_update(1, 42, "my name is Ada"))
    assert retry.status_code == 503 and retry.json()["status"] == "duplicate" and retry.json()["reply_pending"]
    assert Episode.objects.count() == 1 and TelegramReply.objects.get().status == ReplyStatus.PENDING

    fake_bot.come_back()
    retry = post(telegram_update(1, 42, "my name is Ada"))
    assert retry.status_code == 200 and retry.json() == {
        "ok": True,
        "status": "duplicate",
        "reply_sent": True,
        "reply_pending": False,
    }
    again = post(telegram_update(1, 42, "my name is Ada"))
    assert again.status_code == 200 and again.json()["status"] == "duplicate"
    assert worker()["replies_sent"] == 0
    (text,) = replies(fake_bot)
    assert "Ada" in text and Episode.objects.count() == 1
    reply = TelegramReply.objects.get()
    assert (reply.status, reply.text, reply.attempts) == (ReplyStatus.SENT, "", 3)  # its words are not kept


def test_a_reply_the_bot_api_refused_is_sent_once_by_the_delivery_worker(post, fake_bot, short_backoff):
    fake_bot.go_down()
    assert post(telegram_update(1, 42, "my name is Ada")).status_code == 503
    assert worker()["replies_claimed"] == 0  # not due yet: the first retry waits 0.5 s
    time.sleep(0.6)
    assert worker()["replies_retried"] == 1  # still down: tried, and left for 1 s later
    fake_bot.come_back()
    time.sleep(1.1)
    report = worker()
    assert (report["replies_claimed"], report["replies_sent"]) == (1, 1)
    assert worker()["replies_claimed"] == 0
    retry = post(telegram_update(1, 42, "my name is Ada"))  # Telegram's retry after the worker sent it
    assert retry.status_code == 200 and retry.json()["reply_sent"] is True
    assert len(replies(fake_bot)) == 1
    assert TelegramReply.objects.get().status == ReplyStatus.SENT


def test_a_reply_telegram_refuses_for_good_is_not_retried(post, fake_bot, short_backoff):
    fake_bot.fail_sends(1, status=403, description="Forbidden: bot was blocked by the user")
    response = post(telegram_update(1, 42, "hello"))
    assert response.status_code == 200 and response.json()["reply_sent"] is False
    assert "403" in response.json()["reply_error"] and BOT_TOKEN not in response.text
    reply = TelegramReply.objects.get()
    assert reply.status == ReplyStatus.FAILED and "blocked" in reply.last_error
    time.sleep(0.6)
    assert worker()["replies_claimed"] == 0 and fake_bot.sent_messages() == []


def dead_run(workflow, update_id, *, lease_left):
    """A claim a server process left behind: `running`, held by a process that is gone."""
    return TelegramUpdate.objects.create(
        workflow=workflow,
        update_id=update_id,
        status=UpdateStatus.RUNNING,
        claimed_by="old-host:4242:0badc0de",
        claimed_until=timezone.now() + timedelta(seconds=lease_left),
    )


def test_an_update_whose_run_died_is_run_by_telegrams_retry(post, fake_bot, demo_workflow):
    row = dead_run(demo_workflow, 5, lease_left=-1)  # its process stopped renewing: the lease ran out
    response = post(telegram_update(5, 42, "my name is Ada"))
    assert response.status_code == 200 and response.json()["status"] == "ran"
    row.refresh_from_db()
    assert (row.status, row.attempts, row.claimed_by) == (UpdateStatus.DONE, 2, "")
    assert post(telegram_update(5, 42, "my name is Ada")).json()["status"] == "duplicate"
    assert len(replies(fake_bot)) == 1 and Episode.objects.count() == 1
    assert MemoryUser.objects.get(canonical_id="telegram:42").facts.get(key="name").value == "Ada"


def test_an_update_running_elsewhere_is_left_for_a_later_retry(post, fake_bot, demo_workflow):
    row = dead_run(demo_workflow, 6, lease_left=60)  # its holder may still be alive: not a duplicate
    busy = post(telegram_update(6, 42, "my name is Ada"))
    assert busy.status_code == 503 and busy.json()["status"] == "busy" and "update_id" in busy.json()["errors"]
    assert not Episode.objects.exists() and fake_bot.sent_messages() == []
    TelegramUpdate.objects.filter(pk=row.pk).update(claimed_until=timezone.now() - timedelta(seconds=1))
    assert post(telegram_update(6, 42, "my name is Ada")).json()["status"] == "ran"
    assert len(replies(fake_bot)) == 1


def test_a_live_process_keeps_its_claim_and_a_finished_one_is_a_duplicate(demo_workflow, settings):
    settings.WORKFLOWS = {**settings.WORKFLOWS, "TELEGRAM_RUN_LEASE_SECONDS": 30}
    claim = claims.claim_update(demo_workflow, 7)
    assert claim.state == "new" and claims.claim_update(demo_workflow, 7).state == "busy"
    TelegramUpdate.objects.filter(pk=claim.row.pk).update(claimed_until=timezone.now() + timedelta(seconds=1))
    assert claims.heartbeat.renew() >= 1  # what the process's heartbeat thread does every 10 s
    renewed = TelegramUpdate.objects.get(pk=claim.row.pk).claimed_until
    assert renewed > timezone.now() + timedelta(seconds=25)
    assert claims.finish(claim)
    assert claim.row.pk not in claims.heartbeat.held()
    assert claims.claim_update(demo_workflow, 7).state == "done"


def test_a_pending_reply_goes_with_its_person(post, fake_bot):
    fake_bot.go_down()
    assert post(telegram_update(1, 42, "my name is Ada")).status_code == 503
    ada = MemoryUser.objects.get(canonical_id="telegram:42")
    assert TelegramReply.objects.get().user_id == ada.pk and "Ada" in TelegramReply.objects.get().text
    MemoryService().delete_users([ada.pk], cascade=True)
    assert not TelegramReply.objects.exists()
