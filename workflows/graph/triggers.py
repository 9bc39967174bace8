"""Trigger payloads: who a run is for, in which conversation, and what they said.

    telegram  a Bot API update: `message`, `edited_message` (from, chat, text or caption) or
              `callback_query` (from, data, message.chat)
    chat, webhook, manual
              {"message": "...", one of "email" / "user_id" / "user_name", optional "display_name",
               "channel" (for user_id / user_name; defaults to the trigger type), "conversation_id"}

An email identifies the person on the `email` channel (so it links across channels); otherwise
`user_id`, then `user_name`, on the payload's channel. Group chats are their own conversation;
one-to-one conversations are "direct".

A Telegram message whose sender is not a person (see `shared_sender`) never identifies one: it runs
as its chat (channel `telegram_chat`, the chat's id) or is not run at all, as TELEGRAM_SHARED_SENDERS says.
"""

from dataclasses import dataclass

from memory.exceptions import InvalidMemoryArgument
from memory.rules.validation import INT64_MAX, INT64_MIN, check_json

from ..conf import workflow_settings
from ..exceptions import InvalidTrigger

TRIGGER_TYPES = ("telegram", "chat", "webhook", "manual")
TELEGRAM_UPDATE_KINDS = ("message", "edited_message", "callback_query")
DIRECT = "direct"
# The memory-user channel of a Telegram chat that acts as the sender (its external id is the chat id).
TELEGRAM_CHAT_CHANNEL = "telegram_chat"
# Sender ids Telegram puts on messages that many people (or nobody) sent: GroupAnonymousBot (anonymous
# group admins), Telegram itself (channel posts forwarded into a linked discussion group, service
# messages) and Channel_Bot (messages posted in a group on behalf of a channel).
SHARED_SENDER_IDS = {
    1087968824: "an anonymous group admin",
    777000: "Telegram (a channel post)",
    136817688: "a channel",
}
SHARED_SENDER_MODES = ("chat", "ignore")


@dataclass(frozen=True)
class TriggerInfo:
    type: str
    channel: str
    external_id: str
    display_name: str
    conversation_id: str
    text: str
    # Where a reply goes on the trigger's own channel (the Telegram chat id), if anywhere.
    reply_to: str = ""
    # Why a Telegram message runs as its chat instead of its sender ("" when the sender is a person).
    shared_sender: str = ""


def parse_trigger(trigger) -> TriggerInfo:
    if not isinstance(trigger, dict):
        raise InvalidTrigger("trigger", "must be an object with type and payload")
    kind = trigger.get("type")
    if kind not in TRIGGER_TYPES:
        raise InvalidTrigger("trigger.type", f"must be one of {', '.join(TRIGGER_TYPES)}, got {kind!r}")
    payload = trigger.get("payload")
    if not isinstance(payload, dict):
        raise InvalidTrigger("payload", "must be a JSON object")
    try:  # the payload is stored with the run's episode: text every database keeps, sane nesting
        check_json("payload", payload)
    except InvalidMemoryArgument as exc:
        raise InvalidTrigger(exc.path, exc.problem) from None
    if kind == "telegram":
        return parse_telegram_update(payload)
    return _parse_direct(kind, payload)


def telegram_update_kind(update):
    """Which handled part an update carries ('message', 'edited_message', 'callback_query'), or None."""
    for kind in TELEGRAM_UPDATE_KINDS:
        if isinstance(update.get(kind), dict):
            return kind
    return None


def shared_sender(update):
    """Why this update's sender must not identify a person, or "" when it is one person speaking.

    Telegram gives one sender id to everyone in some roles (anonymous admins, channels, itself), marks a
    message sent on behalf of a chat with `sender_chat`, and keeps the forwarder as `from` of a forward,
    whose words are somebody else's. Any of these, taken as the sender's own, would let one person's
    memory reach another (or the forwarder's memory hold a stranger's words).
    """
    kind = telegram_update_kind(update)
    if kind is None:
        return ""
    part = update[kind]
    sender = part.get("from")
    sender_id = sender.get("id") if isinstance(sender, dict) else None
    if is_telegram_id(sender_id) and sender_id in SHARED_SENDER_IDS:
        return f"sent as {SHARED_SENDER_IDS[sender_id]} (shared sender id {sender_id})"
    if kind == "callback_query":  # the person who pressed the button, always themselves
        return ""
    if part.get("is_automatic_forward"):
        return "an automatic forward from a linked channel"
    if part.get("sender_chat") is not None:
        return "sent on behalf of a chat (sender_chat)"
    if any(part.get(key) is not None for key in ("forward_origin", "forward_from", "forward_from_chat")):
        return "a forwarded message (someone else's words)"
    if part.get("forward_sender_name") is not None or part.get("forward_date") is not None:
        return "a forwarded message (someone else's words)"
    return ""


def shared_sender_mode():
    """TELEGRAM_SHARED_SENDERS: "chat" (run such messages as their chat) or "ignore" (do not run them)."""
    mode = workflow_settings.TELEGRAM_SHARED_SENDERS
    if mode not in SHARED_SENDER_MODES:
        raise InvalidTrigger(
            "TELEGRAM_SHARED_SENDERS", f"must be one of {', '.join(SHARED_SENDER_MODES)}, got {mode!r}"
        )
    return mode


def telegram_update_ignored(update):
    """Why this update is acknowledged without a run under TELEGRAM_SHARED_SENDERS = "ignore", or ""."""
    reason = shared_sender(update)
    return reason if reason and shared_sender_mode() == "ignore" else ""


def parse_telegram_update(update) -> TriggerInfo:
    kind = telegram_update_kind(update)
    if kind is None:
        raise InvalidTrigger("update", f"carries none of {', '.join(TELEGRAM_UPDATE_KINDS)}")
    part = update[kind]
    sender = part.get("from")
    if not isinstance(sender, dict) or not is_telegram_id(sender.get("id")):
        raise InvalidTrigger(f"{kind}.from.id", "is missing or not an integer")
    shared = shared_sender(update)
    if shared and shared_sender_mode() == "ignore":
        raise InvalidTrigger(f"{kind}.from", f"{shared}: not run (TELEGRAM_SHARED_SENDERS is 'ignore')")
    if kind == "callback_query":
        text = part.get("data") or ""
        message = part.get("message")
        if message is not None and not isinstance(message, dict):
            raise InvalidTrigger("callback_query.message", "must be an object (a Telegram Message)")
        chat = (message or {}).get("chat") or {}
    else:
        text = part.get("text") or part.get("caption") or ""
        chat = part.get("chat") or {}
    if not isinstance(text, str):
        raise InvalidTrigger(f"{kind}.text", "must be a string")
    if not isinstance(chat, dict):
        raise InvalidTrigger(f"{kind}.chat", "must be an object (a Telegram Chat)")
    chat_id = chat.get("id")
    if chat_id is not None and not is_telegram_id(chat_id):
        raise InvalidTrigger(f"{kind}.chat.id", "must be an integer")
    chat_type = chat.get("type")
    if chat_type is not None and not isinstance(chat_type, str):
        raise InvalidTrigger(f"{kind}.chat.type", "must be a string")
    group = chat_type in {"group", "supergroup", "channel"}
    conversation_id = f"telegram-{chat_id}" if group and chat_id is not None else DIRECT
    if shared:
        if chat_id is None:
            raise InvalidTrigger(f"{kind}.chat.id", f"is needed: the message is {shared}, so it runs as its chat")
        title = chat.get("title") or chat.get("username") or ""
        return TriggerInfo(
            type="telegram",
            channel=TELEGRAM_CHAT_CHANNEL,
            external_id=str(chat_id),
            display_name=_display(title if isinstance(title, str) else ""),
            conversation_id=conversation_id,
            text=text.strip(),
            reply_to=str(chat_id),
            shared_sender=shared,
        )
    name = " ".join(p for p in (sender.get("first_name"), sender.get("last_name")) if isinstance(p, str) and p)
    return TriggerInfo(
        type="telegram",
        channel="telegram",
        external_id=str(sender["id"]),
        display_name=_display(
            name or (sender.get("username") if isinstance(sender.get("username"), str) else "") or ""
        ),
        conversation_id=conversation_id,
        text=text.strip(),
        reply_to=str(chat_id if chat_id is not None else sender["id"]),
    )


def _parse_direct(kind, payload):
    text = payload.get("message", payload.get("text", ""))
    if not isinstance(text, str):
        raise InvalidTrigger("message", "must be a string")
    if not text.strip():
        raise InvalidTrigger("message", "must not be empty: a run answers a message")
    email, user_id, user_name = payload.get("email"), payload.get("user_id"), payload.get("user_name")
    channel = payload.get("channel") or kind
    if not isinstance(channel, str):
        raise InvalidTrigger("channel", "must be a string")
    if email not in (None, ""):
        if not isinstance(email, str) or "@" not in email.strip():
            raise InvalidTrigger("email", f"must be an email address, got {email!r}")
        channel, external_id = "email", email.strip().lower()
    elif user_id not in (None, ""):
        if isinstance(user_id, bool) or not isinstance(user_id, (str, int)):
            raise InvalidTrigger("user_id", "must be a string or an integer")
        external_id = str(user_id).strip()
    elif user_name not in (None, ""):
        if not isinstance(user_name, str):
            raise InvalidTrigger("user_name", "must be a string")
        external_id = user_name.strip()
    else:
        raise InvalidTrigger("user_id", "one of email, user_id or user_name is required")
    display_name = payload.get("display_name") or (user_name if isinstance(user_name, str) else "") or ""
    if not isinstance(display_name, str):
        raise InvalidTrigger("display_name", "must be a string")
    conversation = payload.get("conversation_id") or DIRECT
    if not isinstance(conversation, (str, int)) or isinstance(conversation, bool):
        raise InvalidTrigger("conversation_id", "must be a string")
    return TriggerInfo(
        type=kind,
        channel=channel.strip().lower(),
        external_id=external_id,
        display_name=_display(display_name),
        conversation_id=str(conversation),
        text=text.strip(),
    )


def is_telegram_id(value):
    """A Telegram id: an integer that fits the signed 64 bits Telegram (and our columns) use."""
    return isinstance(value, int) and not isinstance(value, bool) and INT64_MIN <= value <= INT64_MAX


DISPLAY_NAME_LENGTH = 200  # memory users' display_name column


def _display(name):
    """A display name as stored: stripped, and cut to the column's length (it is cosmetic: a long one
    must not keep the person from being identified)."""
    name = " ".join(name.split())
    return name if len(name) <= DISPLAY_NAME_LENGTH else name[: DISPLAY_NAME_LENGTH - 1] + "…"
