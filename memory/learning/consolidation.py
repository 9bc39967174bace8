"""Consolidation: distil finished, unprocessed episodes into facts, by built-in rules or a LangChain chat model.

    memory = MemoryService()
    report = memory.consolidate()                      # never raises; report.ok says if all went well
    memory.consolidate(extractor=LLMExtractor(model))  # any LangChain chat model
    memory.consolidate(raise_errors=True)              # raises ConsolidationFailed carrying the report

Each run takes at most CONSOLIDATION["MAX_EPISODES_PER_RUN"] finished episodes that are not yet
processed, oldest first. For each, the extractor proposes facts (outside any transaction: a model
call may be slow); then, in one transaction, every fact is written through `MemoryService.set_fact`
with the episode as `source_episode` and provenance "consolidation", and only then is the episode
marked processed. A fact that repeats a stored one confirms it (the write reports "confirmed").
When the extractor or a write fails, that episode's transaction is rolled back and the episode stays
unprocessed for the next run; the failure is logged and listed in the report. Every run is recorded
(`ConsolidationRun`), which is what /healthz reports as the last consolidation.

Scope of a consolidated fact: the one the extractor asks for when the episode has that owner,
otherwise the episode's user, else its agent, else global.
"""

import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from django.db import DatabaseError
from django.utils import timezone
from django.utils.module_loading import import_string

from ..conf import memory_settings
from ..exceptions import ConsolidationFailed, MemoryServiceError
from ..models import FactType, Scope
from ..text import attribute_fact_type, value_text, words

logger = logging.getLogger("engram.memory.consolidation")

PROVENANCE = "consolidation"


@dataclass(frozen=True)
class ExtractedFact:
    """A fact an extractor proposes; `scope` None means the episode's default owner."""

    key: str
    value: Any
    fact_type: str = FactType.WORLD_KNOWLEDGE
    confidence: float | None = None
    scope: str | None = None


@dataclass
class ConsolidationReport:
    """What one run did. `failed` maps episode id to the error that left it unprocessed."""

    extractor: str
    started_at: datetime
    agent_id: str = ""
    finished_at: datetime | None = None
    episodes_seen: int = 0
    processed: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    actions: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    run_id: int | None = None
    promotion: Any = None  # the promotion sweep that followed (memory.learning.promotion.PromotionReport), if any
    procedures: Any = None  # the procedure learning that followed (memory.learning.procedure_learning), if any

    @property
    def ok(self):
        return not self.failed and not self.errors

    def as_dict(self):
        return {
            "ok": self.ok,
            "run_id": self.run_id,
            "extractor": self.extractor,
            "agent_id": self.agent_id,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "episodes_seen": self.episodes_seen,
            "episodes_processed": len(self.processed),
            "episodes_failed": len(self.failed),
            "processed": list(self.processed),
            "failed": {str(k): v for k, v in self.failed.items()},
            "facts": {a: self.actions.get(a, 0) for a in ("created", "confirmed", "updated", "skipped")},
            "errors": list(self.errors),
            "promotion": self.promotion.as_dict() if self.promotion is not None else None,
            "procedures": self.procedures.as_dict() if self.procedures is not None else None,
        }


# ---------------------------------------------------------------- extractors


class BaseExtractor:
    """Proposes facts for one episode. Raise to say the episode could not be read; it stays unprocessed."""

    @property
    def name(self):
        return type(self).__name__

    def extract(self, episode):
        raise NotImplementedError("Extractor subclasses must provide extract(episode) -> list[ExtractedFact]")


def episode_messages(episode):
    """(role, text) of each message of an episode's conversation."""
    for message in episode.conversation or []:
        if isinstance(message, dict):
            yield str(message.get("role", "")), value_text(message.get("content", ""))
        else:
            yield "", value_text(message)


def episode_transcript(episode, max_chars=None):
    """An episode as plain text for a model: trigger, messages, summary and outcome; the start is kept."""
    lines = [f"trigger: {episode.trigger_type or 'run'}"]
    lines += [f"{role or 'message'}: {text}" for role, text in episode_messages(episode)]
    if episode.summary:
        lines.append(f"summary: {episode.summary}")
    if episode.final_output not in (None, "", {}, []):
        lines.append(f"final output: {value_text(episode.final_output)}")
    if episode.success is not None:
        lines.append(f"outcome: {'success' if episode.success else 'failure'}")
    text = "\n".join(lines)
    if max_chars and len(text) > max_chars:
        text = text[:max_chars] + "\n[transcript cut]"
    return text


_USER_ROLES = {"user", "human"}
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_MY_X_IS_Y = re.compile(r"\bmy\s+(?P<x>[a-z][\w' -]{0,60}?)\s+(?:is|are|=)\s+(?P<y>[^.!?\n]{1,200})", re.IGNORECASE)
_REMEMBER = re.compile(
    r"\b(?:please\s+)?(?:remember|don't forget|do not forget|note)\s+(?:that\s+)?(?P<s>[^.!?\n]{3,300})", re.IGNORECASE
)
_X_IS_Y = re.compile(
    r"^(?:the\s+|my\s+|our\s+)?(?P<x>[a-z][\w' -]{0,60}?)\s+(?:is|are)\s+(?P<y>.{1,200})$", re.IGNORECASE
)
_DECISION = re.compile(
    r"\b(?:decided|concluded|agreed|settled on|chose|chosen|will go with|'ll go with|are going with|decision is)\b"
    r"\s*(?:to\s+|that\s+|on\s+|upon\s+|with\s+|:\s*)?(?P<what>[^.!?\n]{2,200})",
    re.IGNORECASE,
)
# "my X is ..." phrasings that are conversation, not facts about the user.
_NOT_ATTRIBUTES = {
    "question",
    "point",
    "guess",
    "problem",
    "issue",
    "bad",
    "pleasure",
    "understanding",
    "concern",
    "answer",
}


def slug(text, max_words=None, max_length=60):
    found = words(text, ascii_only=True)
    if max_words:
        found = found[:max_words]
    return "_".join(found)[:max_length].strip("_")


def _clean_value(text):
    return text.strip().strip("\"'").rstrip(",;:").strip()


class RuleExtractor(BaseExtractor):
    """The built-in extractor, no model needed (end-of-session consolidation).

    From the user's messages: "my X is Y" (key X, a preference, or a relationship when X names one)
    and "remember that ..." (key from the statement's subject when it reads "X is Y", else
    `note_<first words>`). From every message and the summary: decision language ("we decided to
    ...", "agreed on ...", "we'll go with ...") as `decision_<first words>` holding the sentence.
    """

    name = "rules"

    def __init__(self, confidence=None):
        self.confidence = memory_settings.CONSOLIDATION["RULE_CONFIDENCE"] if confidence is None else confidence

    def extract(self, episode):
        found = {}

        def add(key, value, fact_type):
            if key and value and key not in found:
                found[key] = ExtractedFact(key=key, value=value, fact_type=fact_type, confidence=self.confidence)

        texts = list(episode_messages(episode))
        if episode.summary:
            texts.append(("summary", episode.summary))
        for role, text in texts:
            for sentence in _SENTENCE_END.split(text):
                sentence = sentence.strip()
                if not sentence:
                    continue
                if role.lower() in _USER_ROLES:
                    self._user_statements(sentence, add)
                match = _DECISION.search(sentence)
                if match:
                    add(
                        "decision_" + slug(match.group("what"), max_words=5),
                        sentence.rstrip(".!"),
                        FactType.WORLD_KNOWLEDGE,
                    )
        return list(found.values())

    def _user_statements(self, sentence, add):
        remembered = _REMEMBER.search(sentence)
        if remembered:
            statement = _clean_value(remembered.group("s"))
            subject = _X_IS_Y.match(statement)
            if subject and slug(subject.group("x")):
                mine = re.match(r"\s*my\b", statement, re.IGNORECASE) is not None
                attribute = slug(subject.group("x"))
                add(
                    attribute,
                    _clean_value(subject.group("y")),
                    (attribute_fact_type(attribute) or FactType.USER_PREFERENCE) if mine else FactType.WORLD_KNOWLEDGE,
                )
            else:
                add("note_" + slug(statement, max_words=6), statement, FactType.WORLD_KNOWLEDGE)
            return
        for match in _MY_X_IS_Y.finditer(sentence):
            attribute = slug(match.group("x"))
            if not attribute or attribute in _NOT_ATTRIBUTES:
                continue
            add(attribute, _clean_value(match.group("y")), attribute_fact_type(attribute) or FactType.USER_PREFERENCE)


_SYSTEM_PROMPT = """You distil durable facts from the record of one agent run.
Extract only facts worth remembering in later conversations: the user's preferences and personal
details, decisions that were made, corrections, relationships, and knowledge about the world or
the agent itself. Skip small talk and anything that only mattered during this run.
For each fact give:
- key: a short snake_case name (e.g. favourite_colour, deploy_day, decision_database)
- value: the value, as short as possible
- fact_type: one of {fact_types}
- confidence: from 0 to 1, how sure the record makes you
- scope: "user" for facts about this user, "agent" for the agent's own knowledge, "global" for facts
  that hold for everyone, "session" for facts that only matter in this session
Return no facts when there is nothing durable."""

_JSON_INSTRUCTIONS = """
Answer with one JSON object and nothing else, shaped like:
{"facts": [{"key": "favourite_colour", "value": "green", "fact_type": "user_preference", "confidence": 0.9, "scope": "user"}]}"""


def _schemas():
    """Pydantic schemas of the LLM's answer (built lazily: pydantic comes with langchain-core)."""
    from pydantic import BaseModel, Field

    class FactItem(BaseModel):
        """One durable fact."""

        key: str = Field(description="short snake_case name of the fact")
        value: Any = Field(description="the value: a string, number, boolean, list or object")
        fact_type: Literal[tuple(FactType.values)] = Field(description="kind of fact")
        confidence: float = Field(ge=0.0, le=1.0, description="0 to 1")
        scope: Literal[tuple(Scope.values)] = Field(default=Scope.USER, description="who the fact belongs to")

    class ExtractedFacts(BaseModel):
        """The durable facts found in one agent run."""

        facts: list[FactItem]

    return ExtractedFacts


_FENCE = re.compile(r"^\s*```(?:json)?\s*|\s*```\s*$", re.IGNORECASE)


class LLMExtractor(BaseExtractor):
    """Asks a LangChain chat model for facts: structured output where the model supports it, else JSON.

    `model`: any `BaseChatModel`; default: CONSOLIDATION["MODEL"] (a dotted path to a chat model class
    or factory) called with CONSOLIDATION["MODEL_KWARGS"]. An answer that does not fit the schema is a
    failure of that episode: nothing of it is stored and it stays unprocessed.
    """

    def __init__(self, model=None):
        if model is None:
            conf = memory_settings.CONSOLIDATION
            if not conf["MODEL"]:
                raise MemoryServiceError(
                    "CONSOLIDATION['MODEL'] is not set: name a LangChain chat model class for the LLM extractor"
                )
            model = import_string(conf["MODEL"])(**conf["MODEL_KWARGS"])
        self.model = model
        self.schema = _schemas()
        try:
            self.structured = model.with_structured_output(self.schema)
        except NotImplementedError:  # models without tool calling or JSON mode answer in text
            self.structured = None
        self.max_chars = memory_settings.CONSOLIDATION["MAX_TRANSCRIPT_CHARS"]

    @property
    def name(self):
        return f"llm:{type(self.model).__name__}"

    def _messages(self, episode, json_text):
        from langchain_core.messages import HumanMessage, SystemMessage

        system = _SYSTEM_PROMPT.format(fact_types=", ".join(FactType.values))
        if json_text:
            system += _JSON_INSTRUCTIONS
        return [SystemMessage(content=system), HumanMessage(content=episode_transcript(episode, self.max_chars))]

    def extract(self, episode):
        if self.structured is not None:
            answer = self.structured.invoke(self._messages(episode, json_text=False))
            if isinstance(answer, dict):
                answer = self.schema.model_validate(answer)
        else:
            reply = self.model.invoke(self._messages(episode, json_text=True))
            text = reply.content if isinstance(reply.content, str) else value_text(reply.content)
            try:
                data = json.loads(_FENCE.sub("", text))
            except json.JSONDecodeError as exc:
                raise ValueError(f"the model did not answer with JSON ({exc.msg} at char {exc.pos})") from None
            answer = self.schema.model_validate(data)  # pydantic's ValidationError names the bad field
        return [
            ExtractedFact(key=f.key, value=f.value, fact_type=f.fact_type, confidence=f.confidence, scope=f.scope)
            for f in answer.facts
        ]


def get_extractor():
    """The extractor named by CONSOLIDATION["EXTRACTOR"]."""
    return import_string(memory_settings.CONSOLIDATION["EXTRACTOR"])()


# ---------------------------------------------------------------- the run


def fact_owner(episode, requested):
    """Scope and owner arguments of a consolidated fact: the requested scope when the episode has that owner."""
    owners = {
        Scope.SESSION: {"session_id": episode.session_id} if episode.session_id else None,
        Scope.USER: {"user_id": episode.user_id} if episode.user_id else None,
        Scope.AGENT: {"agent_id": episode.agent_id} if episode.agent_id else None,
        Scope.GLOBAL: {},
    }
    if requested in owners and owners[requested] is not None:
        return requested, owners[requested]
    for scope in (Scope.USER, Scope.AGENT, Scope.GLOBAL):
        if owners[scope] is not None:
            return scope, owners[scope]


def run_consolidation(service, *, limit=None, agent_id=None, episode_ids=None, extractor=None, raise_errors=False):
    """Consolidate up to `limit` unprocessed episodes (of one agent, or the given ids); returns a report.

    Never raises unless `raise_errors`: then a run with any failure raises ConsolidationFailed (after
    recording it) carrying the same report.
    """
    report = ConsolidationReport(extractor="?", started_at=timezone.now(), agent_id=agent_id or "")
    try:
        extractor = extractor if extractor is not None else get_extractor()
        report.extractor = extractor.name
        episodes = service.unconsolidated_episodes(
            limit=limit or memory_settings.CONSOLIDATION["MAX_EPISODES_PER_RUN"],
            agent_id=agent_id,
            episode_ids=episode_ids,
        )
    except Exception as exc:  # noqa: BLE001  (an import string, a model constructor or the database; all reported)
        logger.warning("consolidation could not start: %s", exc, exc_info=True)
        report.errors.append(f"{type(exc).__name__}: {exc}")
        episodes = []
    report.episodes_seen = len(episodes)
    overwrite = memory_settings.CONSOLIDATION["OVERWRITE"]
    for episode in episodes:
        try:
            proposed = extractor.extract(episode)
        except Exception as exc:  # noqa: BLE001  (a model's errors have no common base class)
            logger.warning("consolidation: extractor %s failed on episode %s: %s", report.extractor, episode.pk, exc)
            report.failed[episode.pk] = f"extractor failed: {type(exc).__name__}: {exc}"
            continue
        facts = []
        for item in proposed:
            scope, owner = fact_owner(episode, item.scope)
            facts.append(
                {
                    "key": item.key,
                    "value": item.value,
                    "fact_type": item.fact_type,
                    "confidence": item.confidence,
                    "scope": scope,
                    **owner,
                }
            )
        try:
            writes = service.store_consolidated_facts(episode.pk, facts, overwrite=overwrite, provenance=PROVENANCE)
        except (MemoryServiceError, DatabaseError) as exc:
            logger.warning("consolidation: episode %s not stored: %s", episode.pk, exc)
            report.failed[episode.pk] = f"not stored: {type(exc).__name__}: {exc}"
            continue
        if writes is None:  # another run consolidated it meanwhile
            continue
        report.processed.append(episode.pk)
        report.actions.update(w.action for w in writes)
    report.finished_at = timezone.now()
    try:
        report.run_id = service.record_consolidation_run(report)
    except DatabaseError as exc:  # the run's outcome stands; only its record is missing
        logger.warning("consolidation: could not record the run: %s", exc)
        report.errors.append(f"run not recorded: {type(exc).__name__}: {exc}")
    if not report.ok:
        logger.warning("consolidation finished with failures: %s", report.as_dict())
        if raise_errors:
            raise ConsolidationFailed(report)
    return report


def consolidate_after_run(service, episode_id):
    """For workflows, when a run ends: consolidate its episode if CONSOLIDATION["AFTER_EACH_RUN"]; never raises.

    Returns the report, or None when the setting is off.
    """
    if not memory_settings.CONSOLIDATION["AFTER_EACH_RUN"]:
        return None
    return run_consolidation(service, episode_ids=[episode_id], raise_errors=False)
