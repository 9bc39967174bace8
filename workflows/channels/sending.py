"""Channels reminders go out through: each one sends a text to an address and says how it went.

    class MyChannel:
        name = "sms"
        def address(self, person, thread): ...   # an Address, or None when it cannot reach them
        def send(self, text, address): ...       # a DeliveryResult; never raises for a failed send

    register_channel(MyChannel())

Built in:

- **telegram**: `sendMessage` to the person's Telegram id, through the shared Bot API client.
- **webhook**: a JSON POST to the URL configured on the conversation's workflow
  (`definition["triggers"]["webhook"]["reminder_url"]`), for conversations whose channel has no push
  API of its own (webhook, chat, manual triggers). The body names the person on their channel, the
  conversation and the reminder; `Idempotency-Key` carries the reminder's reference, since delivery is
  at least once (a worker killed between the send and its record sends it again), and with
  WORKFLOWS["REMINDER_WEBHOOK_SECRET"] `X-Engram-Signature` signs the body. Any 2xx answer is delivered.

Sends happen outside any transaction (workflows.channels.delivery calls them between its claim and
its record).
"""

import hashlib
import hmac
import json
import threading
from dataclasses import dataclass
from typing import Protocol

import httpx

from ..conf import on_workflow_settings_changed, workflow_settings
from ..exceptions import TelegramError
from ..language.definition import reminder_url
from .telegram import get_bot_api

MAX_ERROR = 500


@dataclass(frozen=True)
class Address:
    """Where a message goes: `to` (a Telegram chat id, a URL) and, for channels that pass them on, who
    it is for on their channel, the conversation, and a reference (e.g. "reminder:12") for idempotency."""

    to: str
    channel: str = ""
    user_external_id: str = ""
    conversation_id: str = ""
    thread_id: str = ""
    workflow: str = ""
    reference: str = ""


@dataclass(frozen=True)
class DeliveryResult:
    ok: bool
    error: str = ""


@dataclass(frozen=True)
class Person:
    """Whom a reminder is for: their memory user id and {channel: their id there}."""

    user_id: int
    identities: dict


class Channel(Protocol):
    name: str

    def address(self, person: Person, thread) -> Address | None: ...

    def send(self, text: str, address: Address) -> DeliveryResult: ...


class TelegramChannel:
    name = "telegram"

    def address(self, person, thread):
        # A conversation on Telegram, or none known: the person's own chat with the bot.
        if thread is not None and thread.channel != self.name:
            return None
        external_id = person.identities.get(self.name)
        return Address(to=external_id, channel=self.name, user_external_id=external_id) if external_id else None

    def send(self, text, address):
        to = address.to
        try:
            get_bot_api().send_message(int(to) if to.lstrip("-").isdigit() else to, text)
        except TelegramError as exc:
            return DeliveryResult(False, str(exc)[:MAX_ERROR])
        return DeliveryResult(True)


class WebhookChannel:
    name = "webhook"

    def __init__(self):
        self._client = None
        self._lock = threading.Lock()

    def address(self, person, thread):
        if thread is None or thread.workflow is None or thread.channel in CHANNELS:
            return None  # a conversation on a channel with its own sender goes out there
        url = reminder_url(thread.workflow.definition)
        if not url:
            return None
        return Address(
            to=url,
            channel=thread.channel,
            user_external_id=person.identities.get(thread.channel, ""),
            conversation_id=thread.conversation_id,
            thread_id=thread.thread_id,
            workflow=thread.workflow.slug,
        )

    def client(self):
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(timeout=float(workflow_settings.REMINDER_WEBHOOK_TIMEOUT))
            return self._client

    def reset(self):
        with self._lock:
            if self._client is not None:
                self._client.close()
            self._client = None

    def send(self, text, address):
        body = json.dumps(
            {
                "type": "reminder",
                "text": text,
                "reference": address.reference,
                "workflow": address.workflow,
                "channel": address.channel,
                "user_id": address.user_external_id,
                "conversation_id": address.conversation_id,
                "thread_id": address.thread_id,
            },
            ensure_ascii=False,
        ).encode()
        headers = {"Content-Type": "application/json"}
        if address.reference:
            headers["Idempotency-Key"] = address.reference
        secret = workflow_settings.REMINDER_WEBHOOK_SECRET
        if secret:
            digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
            headers["X-Engram-Signature"] = f"sha256={digest}"
        try:
            response = self.client().post(address.to, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return DeliveryResult(False, f"POST {address.to}: {type(exc).__name__}: {exc}"[:MAX_ERROR])
        if not 200 <= response.status_code < 300:
            return DeliveryResult(False, f"POST {address.to}: HTTP {response.status_code}"[:MAX_ERROR])
        return DeliveryResult(True)


# name -> channel. Telegram first: a person with no conversation to answer in is reached there.
CHANNELS = {"telegram": TelegramChannel()}
FALLBACK_CHANNELS = {"webhook": WebhookChannel()}


def register_channel(channel, *, fallback=False):
    """Add a channel: by its name (conversations on that channel go out through it), or with
    `fallback` as a channel for conversations whose channel has no sender of its own."""
    (FALLBACK_CHANNELS if fallback else CHANNELS)[channel.name] = channel


def channels():
    return [*CHANNELS.values(), *FALLBACK_CHANNELS.values()]


def route(person, thread):
    """(channel, address) for a reminder set in `thread` (None: not known), or None if nothing reaches it."""
    for channel in channels():
        address = channel.address(person, thread)
        if address is not None:
            return channel, address
    return None


def send_timeout():
    """The longest a send may take, over the built-in channels."""
    return max(float(workflow_settings.TELEGRAM_TIMEOUT), float(workflow_settings.REMINDER_WEBHOOK_TIMEOUT))


def _settings_changed():
    for channel in FALLBACK_CHANNELS.values():
        if hasattr(channel, "reset"):
            channel.reset()


on_workflow_settings_changed(_settings_changed)
