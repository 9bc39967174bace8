"""Observation: facts extracted from a conversation turn as it happens, reconciled with what is stored.

    memory = MemoryService()
    report = memory.observe(messages, user_id=ada.pk, chat_model=model, episode_id=episode.pk)
    report.ok, report.decisions   # each: add / update / delete / none, with the model's reason

Two structured calls of a LangChain chat model per turn, at most: the first proposes facts from
the turn (key, value, type, scope and the words each came from); then, for each proposal, the
stored facts it may touch are recalled (those its own words find, by keyword recall; with an
embedder, those the turn's meaning finds, by one vector recall of what the user said; and the
fact stored under the same key), and the second call decides, for every proposal at once, to
add it, update a stored fact with it, delete a stored fact it makes untrue, or do nothing.

The model calls run before any write and outside any transaction. Every decision is checked
before the first write: an answer that does not fit the schemas, names a stored fact the model
was not shown, or a model that raises, writes nothing and is reported (the exception's type
named). The decisions are then applied through the service's own writes, all in one
transaction (a write the service refuses, such as an unknown episode or a bad key, rolls back the
turn's others and is reported): add and update through `set_fact` (confidence, history,
contradiction edges, limits, validation), delete through `forget_visible` (the fact's history
keeps a `deleted` version). A fact written from a turn names its episode (`source_episode`) and, in its
provenance, the message and the words it came from.

Without a chat model, the built-in rules (memory.learning.consolidation.RuleExtractor:
"my X is Y", "remember that ...", decisions) propose the facts and the decision follows the key:
absent is added, a different value updates it, the same value is left alone.
"""

import functools
import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Literal

from django.db import transaction

from ..embedding.embedder import configured_mode
from ..exceptions import InvalidMemoryArgument, MemoryNotFound, MemoryServiceError
from ..models import FactType, Scope
from ..rules.validation import check_user_id, clean_text
from ..text import value_text
from .consolidation import RuleExtractor

logger = logging.getLogger("engram.memory.observation")

ACTIONS = ("add", "update", "delete", "none")
# Bounds of one turn: the model may propose this many facts; each is shown this many stored ones.
MAX_PROPOSALS = 20
CANDIDATES_PER_PROPOSAL = 5
# The longest turn sent to the model (its start is kept).
MAX_TURN_CHARS = 8000
# The longest query candidates are recalled by (recall's own limit).
MAX_CANDIDATE_QUERY = 4000
PROVENANCE = "observe"

_EXTRACT_PROMPT = """You read one turn of a conversation and propose the durable facts it states:
the user's preferences, personal details and relationships, decisions, corrections, knowledge.
Skip small talk and anything that only matters in this turn. For each fact give:
- key: a short snake_case name (e.g. favourite_food, home_city, diet)
- value: the value, as short as possible
- fact_type: one of {fact_types}
- scope: "user" for facts about this user (the usual case), "session" for this conversation only,
  "agent" for the agent's own knowledge
- words: the words of the turn the fact comes from, quoted exactly
- message: the number of the message those words are in
Propose nothing when the turn states nothing durable."""

_DECIDE_PROMPT = """You keep a memory consistent. Each numbered proposal is a fact just read from the
conversation; under it are the stored facts it may touch (key, value, scope). For every proposal decide:
- "add": it is new; store it under its own key
- "update": it changes a stored fact; give that fact's key (its value becomes the proposal's)
- "delete": it makes a stored fact untrue and replaces nothing; give that fact's key
- "none": it is already stored, or not worth storing
Give a short reason for each decision. One decision per proposal."""


@functools.cache
def _schemas():
    """Pydantic schemas of the two answers (built once, lazily: pydantic comes with langchain-core)."""
    from pydantic import BaseModel, Field

    class ProposedFact(BaseModel):
        """One durable fact stated in the turn."""

        key: str = Field(description="short snake_case name of the fact")
        value: Any = Field(description="the value: a string, number, boolean, list or object")
        fact_type: Literal[tuple(FactType.values)] = Field(default=FactType.WORLD_KNOWLEDGE)
        scope: Literal[Scope.USER, Scope.SESSION, Scope.AGENT] = Field(default=Scope.USER)
        words: str = Field(default="", description="the words of the turn it comes from")
        message: int | None = Field(default=None, description="number of the message the words are in")

    class ProposedFacts(BaseModel):
        """The durable facts stated in one conversation turn."""

        facts: list[ProposedFact] = Field(max_length=MAX_PROPOSALS)

    class Decision(BaseModel):
        """What to do with one proposal."""

        proposal: int = Field(ge=0, description="number of the proposal")
        action: Literal[ACTIONS]
        key: str | None = Field(default=None, description="the stored fact's key, for update and delete")
        reason: str = Field(default="")

    class Decisions(BaseModel):
        """One decision per proposal."""

        decisions: list[Decision]

    return ProposedFacts, Decisions


class ObservationFailed(MemoryServiceError):
    """The model's answers could not be used; nothing was written."""


@dataclass
class ObserveReport:
    """What one observe call did. `decisions`: one dict per proposal, with what its write did."""

    extractor: str
    proposals: list[dict] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    model_calls: int = 0

    @property
    def ok(self):
        return not self.errors and not any(d.get("error") for d in self.decisions)

    def counts(self):
        found = dict.fromkeys(ACTIONS, 0)
        for decision in self.decisions:
            if not decision.get("error"):
                found[decision["action"]] += 1
        return found

    def as_dict(self):
        return {
            "ok": self.ok,
            "extractor": self.extractor,
            "model_calls": self.model_calls,
            "proposals": list(self.proposals),
            "decisions": list(self.decisions),
            "counts": self.counts(),
            "errors": list(self.errors),
        }


@dataclass(frozen=True)
class _Turn:
    """The observed messages as (role, text, reference): reference names the message in provenance."""

    lines: list

    @classmethod
    def of(cls, messages):
        if not isinstance(messages, (list, tuple)) or not messages:
            raise InvalidMemoryArgument("messages", "must be a non-empty list of messages")
        lines = []
        for number, message in enumerate(messages):
            if isinstance(message, dict):
                role, content, ref = message.get("role", ""), message.get("content", ""), message.get("id")
            elif hasattr(message, "content") and hasattr(message, "type"):
                role, content, ref = message.type, message.content, getattr(message, "id", None)
            elif isinstance(message, str):
                role, content, ref = "user", message, None
            else:
                raise InvalidMemoryArgument(
                    "messages", f"item {number} must be a message, a {{role, content}} dict or text"
                )
            text = clean_text(f"messages[{number}].content", value_text(content), required=False)
            lines.append((str(role or "user"), text, str(ref) if ref else str(number)))
        return cls(lines)

    def said(self):
        """What the user said in the turn (every message, when none is the user's), as one query."""
        user = [text for role, text, _ in self.lines if role in ("user", "human") and text]
        return "\n".join(user or [text for _, text, _ in self.lines if text])[:MAX_CANDIDATE_QUERY].strip()

    def transcript(self):
        text = "\n".join(f"[{n}] {role}: {text}" for n, (role, text, _) in enumerate(self.lines))
        return text[:MAX_TURN_CHARS]

    def reference(self, number, words):
        ref = self.lines[number][2] if number is not None and 0 <= number < len(self.lines) else None
        quoted = f': "{words[:300]}"' if words else ""
        return f"{PROVENANCE} (message {ref}){quoted}" if ref else f"{PROVENANCE}{quoted}"


class Observer:
    """One observe call: propose, recall candidates, decide, check, apply."""

    def __init__(self, service, *, user_id, agent_id, session_id, chat_model, episode_id):
        self.service = service
        self.viewer = {"agent_id": agent_id or "", "user_id": user_id, "session_id": session_id or ""}
        self.model = chat_model
        self.episode_id = episode_id
        name = f"llm:{type(chat_model).__name__}" if chat_model is not None else "rules"
        self.report = ObserveReport(extractor=name)

    # ---- proposals

    def propose(self, turn):
        if self.model is None:
            return self._rule_proposals(turn)
        from langchain_core.messages import HumanMessage, SystemMessage

        schema, _ = _schemas()
        prompt = [
            SystemMessage(content=_EXTRACT_PROMPT.format(fact_types=", ".join(FactType.values))),
            HumanMessage(content=turn.transcript()),
        ]
        answer = self._ask(schema, prompt)
        return [item.model_dump() for item in answer.facts]

    def _rule_proposals(self, turn):
        proposals = []
        for number, (role, text, _) in enumerate(turn.lines):
            episode = SimpleNamespace(conversation=[{"role": role, "content": text}], summary="")
            for fact in RuleExtractor().extract(episode):
                proposals.append(
                    {
                        "key": fact.key,
                        "value": fact.value,
                        "fact_type": fact.fact_type,
                        "scope": Scope.USER if self.viewer["user_id"] is not None else Scope.SESSION,
                        "words": text,
                        "message": number,
                    }
                )
        return proposals[:MAX_PROPOSALS]

    def _ask(self, schema, prompt):
        """One structured call; any failure (the model's, or an answer that fits no schema) is ObservationFailed."""
        self.report.model_calls += 1
        try:
            structured = self.model.with_structured_output(schema)
            answer = structured.invoke(prompt)
            if isinstance(answer, dict):
                answer = schema.model_validate(answer)
        except Exception as exc:  # noqa: BLE001  (a model's errors have no common base class; all reported)
            raise ObservationFailed(f"{schema.__name__}: {type(exc).__name__}: {exc}") from exc
        if not isinstance(answer, schema):
            raise ObservationFailed(f"{schema.__name__}: the model gave no structured answer ({type(answer).__name__})")
        return answer

    # ---- candidates

    def all_candidates(self, turn, proposals):
        """Each proposal's candidates, {key: fact}: the stored facts its own words find, the one under
        its key, and (with an embedder) those the turn's meaning finds.

        By meaning, the turn is recalled once, not each proposal: the proposals are read from the
        turn, and the turn's words are what the turn's own recall just embedded (the recall node
        asks with the same message), so the query's vector is usually cached; a vector per proposal
        would be one more model call each. By words, each proposal is looked up on its own (keyword
        recall: no model call), so a proposal still finds a stored fact that shares its words.
        """
        if self.model is None:  # the rules decide by the key alone (_rule_decision): nothing else to find
            return [self._same_key(p, {}) for p in proposals]
        related = self._recall(turn.said(), "vector") if configured_mode() == "hybrid" else []
        return [self.candidates(p, related) for p in proposals]

    def candidates(self, proposal, related=()):
        """The stored facts, visible to this viewer, one proposal may touch, {key: fact}: those its
        words find, those in `related` (the turn's, by meaning), and the one under its key."""
        found = {}
        for hit in [*self._recall(_candidate_query(proposal), "keyword"), *related]:
            found.setdefault(hit.item.key, hit.item)
        return self._same_key(proposal, found)

    def _same_key(self, proposal, found):
        """`found` with the fact this viewer sees under the proposal's key, if any."""
        if proposal["key"] not in found:
            try:
                same_key = self.service.get_fact(proposal["key"], **self.viewer)
            except InvalidMemoryArgument:  # a key the service would refuse: the decision's write says so
                same_key = None
            if same_key is not None:
                found[same_key.key] = same_key
        return found

    def _recall(self, query, mode):
        try:
            return self.service.recall(
                query,
                types=("facts",),
                limit=CANDIDATES_PER_PROPOSAL,
                min_confidence=0.0,
                mode=mode,
                record=False,  # looking for what to reconcile is not a use of the memory
                **self.viewer,
            )
        except InvalidMemoryArgument:  # a query with no searchable word: the key alone still finds its fact
            return []
        except MemoryNotFound as exc:  # the person does not exist (or was forgotten meanwhile): nothing to write
            raise ObservationFailed(f"user_id: {exc}") from exc

    # ---- decisions

    def decide(self, proposals, candidates):
        if self.model is None:
            return [self._rule_decision(n, p, candidates[n]) for n, p in enumerate(proposals)]
        from langchain_core.messages import HumanMessage, SystemMessage

        _, schema = _schemas()
        blocks = []
        for n, (proposal, stored) in enumerate(zip(proposals, candidates)):
            lines = [f"[{n}] {proposal['key']} = {value_text(proposal['value'])} ({proposal['scope']})"]
            lines += [f"    stored: {f.key} = {value_text(f.value)} ({f.scope})" for f in stored.values()]
            if not stored:
                lines.append("    stored: nothing related")
            blocks.append("\n".join(lines))
        prompt = [SystemMessage(content=_DECIDE_PROMPT), HumanMessage(content="\n".join(blocks))]
        answer = self._ask(schema, prompt)
        return [d.model_dump() for d in answer.decisions]

    @staticmethod
    def _rule_decision(number, proposal, stored):
        existing = stored.get(proposal["key"])
        if existing is None:
            return {"proposal": number, "action": "add", "key": None, "reason": "no fact under this key"}
        if value_text(existing.value) == value_text(proposal["value"]):
            return {"proposal": number, "action": "none", "key": None, "reason": "already stored"}
        return {"proposal": number, "action": "update", "key": existing.key, "reason": "a new value for this key"}

    def check(self, proposals, candidates, decisions):
        """The decisions, checked, in order (a proposal without one: none), or ObservationFailed naming the fault.

        A proposal takes one add, update or none, and besides it any deletes of the stored facts it
        makes untrue ("I'm vegetarian now": add `diet`, delete `favourite_food`).
        """
        kept, main, touched = [], set(), {}
        for decision in decisions:
            number, action = decision["proposal"], decision["action"]
            if number >= len(proposals):
                raise ObservationFailed(f"Decisions: proposal {number} does not exist (there are {len(proposals)})")
            if action != "delete":
                if number in main:
                    raise ObservationFailed(f"Decisions: proposal {number} has two add, update or none decisions")
                main.add(number)
            if action in ("update", "delete"):
                key = decision.get("key") or ""
                target = candidates[number].get(key)
                if target is None:
                    raise ObservationFailed(
                        f"Decisions: proposal {number}: {action} names {key!r}, "
                        "which is not among the stored facts it was shown"
                    )
                if touched.get(target.pk, action) != action or (action == "delete" and target.pk in touched):
                    raise ObservationFailed(f"Decisions: the stored fact {key!r} is changed by two decisions")
                touched[target.pk] = action
                decision["target"] = target
            kept.append(decision)
        kept += [
            {"proposal": n, "action": "none", "key": None, "reason": "no decision given"}
            for n in range(len(proposals))
            if n not in main and not any(d["proposal"] == n for d in kept)
        ]
        return kept

    # ---- writes

    def _owner(self, scope):
        owner = {
            Scope.USER: {"user_id": self.viewer["user_id"]},
            Scope.SESSION: {"session_id": self.viewer["session_id"]},
            Scope.AGENT: {"agent_id": self.viewer["agent_id"]},
        }.get(scope)
        if owner is None or not next(iter(owner.values())):
            raise InvalidMemoryArgument("scope", f"a {scope} fact needs a {scope} to belong to in this observe call")
        return owner

    def apply(self, turn, proposal, decision):
        """Write one decision through the service; returns what the report says of it."""
        action, target = decision["action"], decision.get("target")
        done = {
            "proposal": decision["proposal"],
            "action": action,
            "key": target.key if target is not None else proposal["key"],
            "reason": str(decision.get("reason") or ""),
        }
        if action == "none":
            return done
        if action == "delete":
            self.service.forget_visible("fact", target.pk, actor=PROVENANCE, **self.viewer)
            return {**done, "fact_id": target.pk, "write": "deleted"}
        if action == "update":
            scope, owner = target.scope, self._owner(target.scope)
        else:
            scope, owner = proposal["scope"], self._owner(proposal["scope"])
        write = self.service.set_fact(
            done["key"],
            proposal["value"],
            scope=scope,
            fact_type=proposal["fact_type"],
            overwrite=True,
            source_episode_id=self.episode_id,
            provenance=turn.reference(proposal.get("message"), proposal.get("words") or ""),
            **owner,
        )
        return {**done, "fact_id": write.fact.pk, "write": write.action}


def _candidate_query(proposal):
    """What a proposal's candidates are found by: its key's words and its value."""
    query = f"{str(proposal['key']).replace('_', ' ')} {value_text(proposal['value'])}"
    return query[:MAX_CANDIDATE_QUERY].strip()


class _Refused(Exception):
    """A write the service refused: every write of the turn is rolled back."""

    def __init__(self, decision, error):
        super().__init__(f"decision {decision['action']} of proposal {decision['proposal']}: {error}")


def run_observe(service, messages, *, user_id, agent_id="", session_id=None, chat_model=None, episode_id=None):
    """Extract facts from one turn and reconcile them with what is stored; returns an ObserveReport.

    Bad arguments raise InvalidMemoryArgument (naming the field) before the model is asked. A
    model that fails or answers outside the schemas writes nothing, and so does a decision the
    service refuses (an unknown user or episode, a bad key, a limit): the turn's writes are one
    transaction, made after the model has answered. The report's `errors` says why.
    """
    turn = _Turn.of(messages)
    agent_id = clean_text("agent_id", agent_id, required=False, max_length=128)
    session_id = clean_text("session_id", session_id or "", required=False, max_length=128)
    if user_id is not None:
        user_id = check_user_id("user_id", user_id, required=True)
    if episode_id is not None:
        episode_id = check_user_id("episode_id", episode_id, required=True)
    observer = Observer(
        service,
        user_id=user_id,
        agent_id=agent_id,
        session_id=session_id,
        chat_model=chat_model,
        episode_id=episode_id,
    )
    report = observer.report
    try:
        proposals = observer.propose(turn)
        report.proposals = [{k: p[k] for k in ("key", "value", "fact_type", "scope", "words")} for p in proposals]
        if not proposals:
            return report
        candidates = observer.all_candidates(turn, proposals)
        decisions = observer.check(proposals, candidates, observer.decide(proposals, candidates))
    except ObservationFailed as exc:
        logger.warning("observe: nothing written: %s", exc)
        report.errors.append(str(exc))
        return report
    applied = []
    try:
        # The model has answered: from here on, only the service's writes, all or none of them.
        with transaction.atomic():
            for decision in decisions:
                try:
                    applied.append(observer.apply(turn, proposals[decision["proposal"]], decision))
                except MemoryServiceError as exc:
                    raise _Refused(decision, f"{type(exc).__name__}: {exc}") from exc
    except _Refused as exc:
        logger.warning("observe: nothing written: %s", exc)
        report.errors.append(str(exc))
        return report
    report.decisions = applied
    return report
