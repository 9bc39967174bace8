"""Telegram's shared or service senders never identify a person: they run as their chat, or not at all.

Telegram sends anonymous group admins' messages as user 1087968824, channel posts in linked groups as
777000, messages on behalf of a chat with `sender_chat`, and forwards with the forwarder as `from`. Over
real HTTP (Django's live server) to the demo workflow, with the fake Bot API on 127.0.0.1 taking replies.
"""

import httpx
import pytest
from conftest import WEBHOOK_SECRET
from django.core.checks import run_checks

from memory.models import ChannelIdentity, Episode, Fact, MemoryUser
from workflows.channels.fake_telegram import telegram_update
from workflows.graph.triggers import TELEGRAM_CHAT_CHANNEL, parse_trigger

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = {"X-Telegram-Bot-Api-Secret-Token": WEBHOOK_SECRET}
GROUP_A, GROUP_B = -1001111, -1002222
ANONYMOUS_ADMIN = {"id": 1087968824, "is_bot": True, "first_name": "Group", "username": "GroupAnonymousBot"}
TELEGRAM = {"id": 777000, "is_bot": False, "first_name": "Telegram"}
CHANNEL_BOT = {"id": 136817688, "is_bot": True, "first_name": "Channel", "username": "Channel_Bot"}
CHANNEL = {"id": -1003333, "type": "channel", "title": "News"}


@pytest.fixture
def post(live_server, demo_workflow, fake_bot):
    url = f"{live_server.url}/telegram/{demo_workflow.slug}/webhook/"
    with httpx.Client(timeout=30) as client:
        yield lambda update: client.post(url, json=update, headers=SECRET)


def group_message(update_id, chat_id, text, **changes):
    """A message in a supergroup, by Ada (42) unless `changes` say otherwise (from, sender_chat, forwards)."""
    update = telegram_update(update_id, 42, text, chat_id=chat_id, chat_type="supergroup")
    update["message"]["chat"]["title"] = f"group {chat_id}"
    update["message"].update(changes)
    return update


def anonymous_admin(chat_id):
    return {"from": ANONYMOUS_ADMIN, "sender_chat": {"id": chat_id, "type": "supergroup", "title": f"group {chat_id}"}}


# Each way Telegram marks a message whose `from` is not the one person who wrote it.
SHARED = {
    "anonymous admin (1087968824)": anonymous_admin,
    "channel post in a linked group (777000)": lambda chat_id: {
        "from": TELEGRAM,
        "sender_chat": CHANNEL,
        "is_automatic_forward": True,
    },
    "on behalf of a channel (sender_chat)": lambda chat_id: {"from": CHANNEL_BOT, "sender_chat": CHANNEL},
    "sender_chat with a person's id": lambda chat_id: {"sender_chat": CHANNEL},
    "automatic forward": lambda chat_id: {"is_automatic_forward": True},
    "forward (forward_origin)": lambda chat_id: {
        "forward_origin": {"type": "user", "date": 1700000000, "sender_user": {"id": 99, "first_name": "Eve"}}
    },
    "forward (forward_from)": lambda chat_id: {"forward_from": {"id": 99, "first_name": "Eve"}},
}


def replies(bot, chat_id):
    return [m["text"] for m in bot.sent_messages(chat_id)]


def test_an_anonymous_admins_secret_does_not_reach_another_group(post, fake_bot):
    """The attack of the issue: an anonymous admin tells group A a secret; the same shared sender id
    asks for it in group B and must not get it. Group A's chat, which heard it, still has it."""
    told = post(group_message(1, GROUP_A, "my bank pin is anonleak4242", **anonymous_admin(GROUP_A)))
    assert told.status_code == 200 and told.json()["status"] == "ran", told.text
    asked = post(group_message(2, GROUP_B, "what is my bank pin?", **anonymous_admin(GROUP_B)))
    assert asked.status_code == 200 and asked.json()["status"] == "ran", asked.text
    (answer,) = replies(fake_bot, GROUP_B)
    assert "anonleak4242" not in answer

    post(group_message(3, GROUP_A, "what is my bank pin?", **anonymous_admin(GROUP_A)))
    assert "anonleak4242" in replies(fake_bot, GROUP_A)[-1]  # the chat's own memory works
    group_a = MemoryUser.objects.get(canonical_id=f"{TELEGRAM_CHAT_CHANNEL}:{GROUP_A}")
    assert Fact.objects.get(value="anonleak4242").user_id == group_a.pk
    assert not ChannelIdentity.objects.filter(channel="telegram", external_id="1087968824").exists()


@pytest.mark.parametrize("shape", list(SHARED))
def test_no_shared_sender_identifies_a_person(post, fake_bot, shape):
    """Each shape: what is said in group A is not answered in group B, the sender id is nobody's
    identity, and Ada (who is also in both groups) is not given it either."""
    marks = SHARED[shape]
    assert post(group_message(1, GROUP_A, "my bank pin is anonleak4242", **marks(GROUP_A))).status_code == 200
    assert post(group_message(2, GROUP_B, "what is my bank pin?", **marks(GROUP_B))).status_code == 200
    assert post(group_message(3, GROUP_B, "what is my bank pin?")).status_code == 200  # Ada herself
    assert post(telegram_update(4, 42, "what is my bank pin?")).status_code == 200  # Ada, in private
    assert all("anonleak4242" not in text for text in replies(fake_bot, GROUP_B) + replies(fake_bot, 42))
    assert len(replies(fake_bot, GROUP_B)) == 2
    (owner,) = MemoryUser.objects.filter(facts__value="anonleak4242")
    assert owner.canonical_id == f"{TELEGRAM_CHAT_CHANNEL}:{GROUP_A}"
    people = set(ChannelIdentity.objects.filter(channel="telegram").values_list("external_id", flat=True))
    assert people == {"42"}  # only Ada, from her own messages


def test_a_forward_in_a_private_chat_is_not_the_forwarders_own_words(post, fake_bot):
    forwarded = telegram_update(1, 42, "my name is Mallory")
    forwarded["message"]["forward_origin"] = {"type": "hidden_user", "date": 1700000000, "sender_user_name": "M"}
    assert post(forwarded).json()["status"] == "ran"
    assert post(telegram_update(2, 42, "what is my name?")).json()["status"] == "ran"
    assert "Mallory" not in replies(fake_bot, 42)[-1]
    ada = MemoryUser.objects.get(canonical_id="telegram:42")
    assert not Fact.objects.filter(user=ada, value="Mallory").exists()


def test_callback_queries_and_plain_messages_still_identify_the_person(post, fake_bot):
    assert post(group_message(1, GROUP_A, "my name is Ada")).json()["status"] == "ran"
    assert post(telegram_update(2, 42, "what is my name?", kind="callback_query")).json()["status"] == "ran"
    assert "Ada" in replies(fake_bot, 42)[-1]
    assert not MemoryUser.objects.filter(canonical_id__startswith=f"{TELEGRAM_CHAT_CHANNEL}:").exists()


def test_with_the_ignore_setting_shared_senders_are_acknowledged_and_not_run(post, fake_bot, settings):
    settings.WORKFLOWS = {**settings.WORKFLOWS, "TELEGRAM_SHARED_SENDERS": "ignore"}
    for n, shape in enumerate(SHARED, start=1):
        response = post(group_message(n, GROUP_A, "my bank pin is anonleak4242", **SHARED[shape](GROUP_A)))
        assert response.status_code == 200 and response.json() == {"ok": True, "status": "ignored"}, shape
    assert not Episode.objects.exists() and not MemoryUser.objects.exists() and fake_bot.sent_messages() == []
    assert post(group_message(99, GROUP_A, "my name is Ada")).json()["status"] == "ran"  # people still run
    assert MemoryUser.objects.get().canonical_id == "telegram:42"


def test_a_run_started_in_code_follows_the_setting_too(settings):
    """parse_trigger is what identify_user reads: "chat" names the chat, "ignore" refuses, naming the field."""
    update = group_message(1, GROUP_A, "hello", **anonymous_admin(GROUP_A))
    info = parse_trigger({"type": "telegram", "payload": update})
    assert (info.channel, info.external_id, info.conversation_id, info.reply_to) == (
        TELEGRAM_CHAT_CHANNEL,
        str(GROUP_A),
        f"telegram-{GROUP_A}",
        str(GROUP_A),
    )
    assert "anonymous group admin" in info.shared_sender
    settings.WORKFLOWS = {**settings.WORKFLOWS, "TELEGRAM_SHARED_SENDERS": "ignore"}
    with pytest.raises(Exception, match="TELEGRAM_SHARED_SENDERS") as raised:
        parse_trigger({"type": "telegram", "payload": update})
    assert raised.value.field == "message.from"


def test_an_unknown_setting_fails_the_system_check(settings):
    settings.WORKFLOWS = {**settings.WORKFLOWS, "TELEGRAM_SHARED_SENDERS": "person"}
    assert [m.id for m in run_checks()] == ["workflows.E003"]
