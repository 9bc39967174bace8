"""The offline responder: a clearly labelled stand-in chat model for when none is configured.

It answers from recalled memory only (no network): "what is my X?" looks the fact up, "what do you
know about me?" lists what is known, statements are acknowledged, and other questions get the recalled
facts they matched or else the line of the conversation's running summary (its turns past the history
limit) that shares most words with them. `facts_in(text)` turns
"remember that ..." and "my X is Y" into facts for the remember node. Every reply starts with LABEL.
"""

import re
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from memory.text import attribute_fact_type, words

from ..language.state import FactToRemember

LABEL = "[offline responder]"
FALLBACK_MESSAGE_ID = "engram-system-prompt"

_REMEMBER = re.compile(r"^\s*(?:please\s+)?remember\s+(?:that\s+)?(?P<what>.+?)\s*[.!]*\s*$", re.IGNORECASE | re.DOTALL)
_MY_X_IS_Y = re.compile(r"^\s*my\s+(?P<key>[\w' -]{1,60}?)\s+(?:is|are|=)\s+(?P<value>.+?)\s*[.!]*\s*$", re.IGNORECASE)
_CALL_ME = re.compile(r"^\s*(?:call me|i am|i'm)\s+(?P<value>[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)?)\s*[.!]*\s*$")
_WHAT_IS_MY = re.compile(
    r"^\s*(?:what(?:'s| is| are)|do you (?:know|remember))\s+my\s+(?P<key>[\w' -]{1,60}?)\s*\??\s*$", re.IGNORECASE
)
# Words that say nothing about what a question is after (matched against the summary's lines).
_FILLER_WORDS = frozenset(
    "a an and any are did do does for from had has have how i in is it me my of on or said say tell "
    "that the this to told was were what when where which who why with you your".split()
)
_ABOUT_ME = re.compile(r"\b(?:what do you (?:know|remember)(?: about me)?|who am i)\b", re.IGNORECASE)


def fact_key(phrase):
    key = re.sub(r"[^a-z0-9]+", "_", phrase.lower()).strip("_")
    return key[:100]


def _statements(text):
    parts = re.split(r"(?<=[.!;\n])\s+|\s+and\s+(?=my\s)", text.strip(), flags=re.IGNORECASE)
    return [p.strip() for p in parts if p and p.strip()]


def facts_in(text) -> list[FactToRemember]:
    """Facts stated in a message: "my X is Y" (key X) and "remember that ..." (a note, or "my X is Y" inside)."""
    facts: list[FactToRemember] = []
    for statement in _statements(text or ""):
        if statement.endswith("?"):
            continue
        remembered = _REMEMBER.match(statement)
        inner = remembered.group("what") if remembered else statement
        mine = _MY_X_IS_Y.match(inner)
        if mine:
            key = fact_key(mine.group("key"))
            fact_type = attribute_fact_type(mine.group("key")) or "world_knowledge"
            facts.append({"key": key, "value": mine.group("value").strip(), "fact_type": fact_type})
            continue
        called = _CALL_ME.match(inner)
        if called and not remembered:
            facts.append({"key": "name", "value": called.group("value"), "fact_type": "world_knowledge"})
            continue
        if remembered:
            first = words(inner, ascii_only=True)[:6]
            facts.append(
                {"key": "note_" + fact_key(" ".join(first)), "value": inner.strip(), "fact_type": "world_knowledge"}
            )
    return facts


def _words(text):
    return {w for w in words(text, ascii_only=True) if len(w) > 2 and w not in _FILLER_WORDS}


def from_summary(question, summary):
    """The line of `summary` sharing most words with `question` (None when none shares any)."""
    asked = _words(question)
    best, best_shared = None, 0
    for line in (summary or "").splitlines():
        shared = len(asked & _words(line))
        if shared > best_shared:
            best, best_shared = line.strip(), shared
    return best


def reply_to(text, memories, user=None, summary="") -> str:
    """The offline answer to `text` given the recalled `memories` (the recall node's dict) and the
    conversation's running `summary`."""
    facts = (memories or {}).get("facts") or []
    own = [f for f in facts if f.get("scope") in ("user", "session")]
    text = (text or "").strip()
    stated = facts_in(text)
    asked = _WHAT_IS_MY.match(text)
    if asked:
        key = fact_key(asked.group("key"))
        found = next((f for f in own if f["key"] == key), None) or next(
            (f for f in own if key in f["key"] or f["key"] in key), None
        )
        if found:
            return f"{LABEL} Your {asked.group('key').strip()} is {_value(found['value'])}."
        return f'{LABEL} I don\'t know your {asked.group("key").strip()} yet. Tell me with "my {asked.group("key").strip()} is ...".'
    if _ABOUT_ME.search(text):
        if not own:
            return f"{LABEL} I don't know anything about you yet."
        known = "; ".join(f"{f['key'].replace('_', ' ')}: {_value(f['value'])}" for f in own)
        return f"{LABEL} Here is what I know about you: {known}."
    if stated:
        noted = "; ".join(
            f"your {f['key'].replace('_', ' ')} is {f['value']}" if not f["key"].startswith("note_") else f["value"]
            for f in stated
        )
        return f"{LABEL} Noted: {noted}."
    matched = [f for f in facts if f.get("matched")]
    if matched:
        known = "; ".join(f"{f['key'].replace('_', ' ')}: {_value(f['value'])}" for f in matched[:5])
        return f"{LABEL} Here is what I remember that may help: {known}."
    # Stored facts first (they are what was kept on purpose), then the conversation's own earlier words.
    earlier = from_summary(text, summary) if text.endswith("?") else None
    if earlier:
        return f"{LABEL} From earlier in our conversation: {earlier}"
    name = next((f["value"] for f in own if f["key"] == "name"), None) or (user or {}).get("display_name")
    greeting = f"Hello {_value(name)}. " if name else "Hello. "
    return (
        f"{LABEL} {greeting}No chat model is configured, so I can only remember and recall: "
        'tell me "my X is Y" or "remember that ...", and ask "what is my X?".'
    )


def _value(value):
    return value if isinstance(value, str) else str(value)


class OfflineResponder(BaseChatModel):
    """A chat model that answers from recalled memory, without a language model. Never calls tools."""

    memories: dict = {}
    user: dict | None = None
    summary: str = ""

    @property
    def _llm_type(self) -> str:
        return "engram-offline-responder"

    def bind_tools(self, tools, **kwargs: Any):
        return self  # it answers without tools

    def _generate(self, messages, stop=None, run_manager=None, **kwargs: Any) -> ChatResult:
        question = next((m.text for m in reversed(messages) if m.type == "human" and m.id != FALLBACK_MESSAGE_ID), "")
        reply = reply_to(question, self.memories, self.user, self.summary)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=reply))])
