"""How workflows recall memory: the one place that picks facts, episodes and procedures for a query.

Nodes and tools call `recall_for`. Facts come from MemoryService.recall (hybrid keyword + vector
recall, or keyword-only without an embedder), topped up with the user's own facts; episodes are this
agent's latest runs with the user; procedures are the active ones whose trigger conditions match.
"""

import json
from dataclasses import dataclass, field

from memory.hints import clean_line, hints_block
from memory.models import SCOPE_RANK, Scope
from memory.service import MemoryService
from memory.text import content_words

from ..conf import workflow_settings

MEMORY_TYPES = ("facts", "episodes", "procedures")


@dataclass(frozen=True)
class RecallScope:
    """Whose memory a recall sees: the agent (workflow), the user it talks to, the session (thread)."""

    agent_id: str = ""
    user_id: int | None = None
    session_id: str = ""
    channel: str = ""


@dataclass(frozen=True)
class RecallOptions:
    memory_types: tuple[str, ...] = MEMORY_TYPES
    limit: int = 10
    min_confidence: float = 0.5
    # The latest N active procedures shown on every run, whatever the query (after the matching ones).
    latest_procedures: int = 0

    @classmethod
    def from_config(cls, config):
        types = config.get("memory_types", config.get("memory_type", "all"))
        if isinstance(types, str):
            types = [types]
        types = MEMORY_TYPES if "all" in types else tuple(t for t in MEMORY_TYPES if t in types)
        return cls(
            memory_types=types,
            limit=int(config.get("limit", 10)),
            min_confidence=float(config.get("min_confidence", 0.5)),
            latest_procedures=int(config.get("latest_procedures", 0)),
        )


@dataclass
class Recalled:
    """What a recall found, as JSON-ready dicts."""

    query: str
    facts: list[dict] = field(default_factory=list)
    episodes: list[dict] = field(default_factory=list)
    procedures: list[dict] = field(default_factory=list)
    # What the character budget left out (kind, id, score, chars), best first (fit_budget).
    cut: list[dict] = field(default_factory=list)

    def as_dict(self):
        return {"query": self.query, "facts": self.facts, "episodes": self.episodes, "procedures": self.procedures}

    def trace(self):
        """What the recall found, for a run's event stream: every hit (kind, id, text, score; score None
        where nothing scored it: the user's own facts topping the list up, recent episodes, procedures
        matched by their conditions) and, per fact key, the scope whose fact won (the most specific one
        the viewer sees hides the others)."""
        hits = [
            {
                "kind": "fact",
                "id": f["id"],
                "key": f["key"],
                "text": f"{f['key']}: {_text(f['value'])}",
                "score": f["score"],
                "scope": f["scope"],
            }
            for f in self.facts
        ]
        hits += [{"kind": "episode", "id": e["id"], "text": e["summary"] or "", "score": None} for e in self.episodes]
        hits += [
            {
                "kind": "procedure",
                "id": p["id"],
                "text": f"{p['name']}: {p['description']}" if p["description"] else p["name"],
                "score": None,
            }
            for p in self.procedures
        ]
        for hit, item in zip(hits, [*self.facts, *self.episodes, *self.procedures], strict=True):
            if item.get("pinned"):
                hit["pinned"] = True
        return {
            "query": self.query,
            "hits": hits,
            "scopes": {f["key"]: f["scope"] for f in self.facts},
            "cut": list(self.cut),
        }


def query_words(text):
    return content_words(text)


def recall_for(query, scope: RecallScope, options: RecallOptions, service=None) -> Recalled:
    """Facts, episodes and procedures relevant to `query` that `scope` may see. One query per memory type.

    Facts: the best `limit` that MemoryService.recall finds for the query; the rest of `limit` is
    filled with this user's and session's own facts, most confident first (WORKFLOWS["TOP_UP_FACTS"]
    of them read). Episodes: this agent's latest runs with this user (none without a user).
    Procedures: active ones whose trigger conditions hold for the query, with the channel as context.
    """
    service = service or MemoryService()
    recalled = Recalled(query=query or "")
    if "facts" in options.memory_types:
        recalled.facts = _facts(service, query, scope, options)
    if "episodes" in options.memory_types and scope.user_id is not None:
        recalled.episodes = [
            {
                "id": e.pk,
                "summary": e.gist,
                "success": e.success,
                "started_at": e.started_at.isoformat(),
            }
            for e in service.recent_episodes(
                agent_id=scope.agent_id, user_id=scope.user_id, limit=min(options.limit, 5)
            )
        ]
    if "procedures" in options.memory_types:
        recalled.procedures = _procedures(service, query, scope, options)
    return recalled


def _procedures(service, query, scope, options):
    """Active procedures whose conditions hold for the query, then the latest `latest_procedures` ones."""
    found = []
    if (query or "").strip():
        context = {"channel": scope.channel} if scope.channel else {}
        limit = min(options.limit, workflow_settings.PROMPT_PROCEDURES)
        found = service.matching_procedures(query, context, agent_id=scope.agent_id, limit=limit)
    if options.latest_procedures:
        seen = {p.pk for p in found}
        latest = service.latest_procedures(agent_id=scope.agent_id, limit=options.latest_procedures)
        found += [p for p in latest if p.pk not in seen]
    return [
        {
            "id": p.pk,
            "name": p.name,
            "description": p.description,
            "procedure_type": p.procedure_type,
            "content": p.content,
        }
        for p in found
    ]


def _facts(service, query, scope, options):
    """The facts MemoryService.recall ranks first for the query, then this user's and session's own
    facts (most confident first) up to `limit`, so "what do you know about me?" has an answer."""
    found, scores = [], {}
    if query_words(query):
        hits = [
            hit
            for hit in service.recall(
                query,
                agent_id=scope.agent_id,
                user_id=scope.user_id,
                session_id=scope.session_id,
                types=("facts",),
                limit=options.limit,
                min_confidence=options.min_confidence,
            )
        ]
        found = [hit.item for hit in hits]
        scores = {hit.id: round(hit.score, 4) for hit in hits}
    matched = {_fact_id(f) for f in found}
    if len(found) < options.limit and (scope.user_id is not None or scope.session_id):
        own = service.list_facts(
            agent_id=scope.agent_id,
            user_id=scope.user_id,
            session_id=scope.session_id,
            min_confidence=options.min_confidence,
            limit=workflow_settings.TOP_UP_FACTS,
        )
        own = sorted(
            (f for f in own if f.scope in (Scope.USER, Scope.SESSION) and _fact_id(f) not in matched),
            key=lambda f: (SCOPE_RANK[f.scope], -f.confidence, f.key),
        )
        found += own[: options.limit - len(found)]
    return [
        {
            "id": _fact_id(f),
            "key": f.key,
            "value": f.value,
            "scope": f.scope,
            "fact_type": f.fact_type,
            "confidence": round(f.confidence, 3),
            "matched": _fact_id(f) in matched,
            # The recall's score for a matched fact; None for the user's own facts that topped it up.
            "score": scores.get(_fact_id(f)),
        }
        for f in found
    ]


def _fact_id(fact):
    """A fact's id, also when recall shows it as the version that holds now (valid time)."""
    return getattr(fact, "fact_id", None) or fact.pk


def render_memory_prompt(recalled: Recalled, user_context=None) -> str:
    """The system-prompt text for recalled memory: an untrusted-hints block, then matching procedures.

    Pinned facts and procedures (add_pins) come first in their lists, marked as pinned."""
    lines = [""]
    if user_context:
        name = user_context.get("display_name") or "unknown name"
        lines.append(
            f"About the person: {clean_line(name)} ({clean_line(user_context.get('canonical_id', ''))}), "
            f"{user_context.get('total_conversations', 0)} conversation(s) so far."
        )
    if recalled.facts:
        lines.append("Facts:")
        lines += [_fact_line(f) for f in recalled.facts]
    if recalled.episodes:
        lines.append("Earlier conversations:")
        lines += [_episode_line(e) for e in recalled.episodes]
    if not (user_context or recalled.facts or recalled.episodes):
        lines.append("(nothing recalled)")
    lines = [hints_block(*lines)]
    if recalled.procedures:
        lines += ["", "## Learned Procedures and Policies", ""]
        lines += [_procedure_line(p) for p in recalled.procedures]
    return "\n".join(lines)


def _fact_line(f):
    pin = "pinned by an operator, " if f.get("pinned") else ""
    return (
        f"- {clean_line(f['key'])}: {clean_line(_text(f['value']))} "
        f"({pin}{f['scope']}, {f['fact_type']}, confidence {f['confidence']:.2f})"
    )


def _episode_line(e):
    return f"- {e['started_at'][:10]}: {clean_line(e['summary'] or '(no summary)')}"


def _procedure_line(p):
    pin = " (pinned)" if p.get("pinned") else ""
    return f"- [{clean_line(p['name'])}]{pin} {clean_line(_procedure_text(p))}"


LINES = {"fact": _fact_line, "episode": _episode_line, "procedure": _procedure_line}


def add_pins(recalled: Recalled, scope: RecallScope, service=None) -> Recalled:
    """Put the pinned facts and procedures `scope` sees at the head of `recalled`, marked `pinned`
    (whatever the query, the recall's types or its limit: an operator pinned them to reach every prompt)."""
    service = service or MemoryService()
    facts, procedures = service.pinned_memories(
        agent_id=scope.agent_id, user_id=scope.user_id, session_id=scope.session_id
    )
    pinned_facts = [
        {
            "id": f.pk,
            "key": f.key,
            "value": f.value,
            "scope": f.scope,
            "fact_type": f.fact_type,
            "confidence": round(f.confidence, 3),
            "matched": True,
            "score": None,
            "pinned": True,
        }
        for f in facts
    ]
    keys = {f["key"] for f in pinned_facts}
    recalled.facts = pinned_facts + [f for f in recalled.facts if f["key"] not in keys]
    pinned_procedures = [
        {
            "id": p.pk,
            "name": p.name,
            "description": p.description,
            "procedure_type": p.procedure_type,
            "content": p.content,
            "pinned": True,
        }
        for p in procedures
    ]
    ids = {p["id"] for p in pinned_procedures}
    recalled.procedures = pinned_procedures + [p for p in recalled.procedures if p["id"] not in ids]
    return recalled


def fit_budget(recalled: Recalled, max_chars) -> Recalled:
    """Keep `recalled` within `max_chars` characters of memory lines (the block's fixed preamble and
    headings not counted): pinned items always stay, first; the rest go in by score, best first
    (items no search scored: the user's own facts, recent episodes, matched procedures, after every
    scored one, in their order), each that still fits; what does not is listed in `recalled.cut`."""
    if max_chars is None:
        return recalled
    groups = {"fact": recalled.facts, "episode": recalled.episodes, "procedure": recalled.procedures}
    items = [(kind, n, item) for kind, group in groups.items() for n, item in enumerate(group)]
    used = sum(len(LINES[kind](item)) for kind, _, item in items if item.get("pinned"))
    ranked = sorted(
        (entry for entry in items if not entry[2].get("pinned")),
        key=lambda e: (e[2].get("score") is None, -(e[2].get("score") or 0.0)),
    )
    dropped = set()
    for kind, n, item in ranked:
        chars = len(LINES[kind](item))
        if used + chars <= max_chars:
            used += chars
        else:
            dropped.add((kind, n))
            recalled.cut.append({"kind": kind, "id": item["id"], "score": item.get("score"), "chars": chars})
    recalled.facts = [f for n, f in enumerate(recalled.facts) if ("fact", n) not in dropped]
    recalled.episodes = [e for n, e in enumerate(recalled.episodes) if ("episode", n) not in dropped]
    recalled.procedures = [p for n, p in enumerate(recalled.procedures) if ("procedure", n) not in dropped]
    return recalled


def _text(value):
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def _procedure_text(procedure):
    content = procedure.get("content")
    if isinstance(content, dict):
        for key in ("prompt", "instructions", "text"):
            if isinstance(content.get(key), str):
                return content[key]
    return procedure.get("description") or _text(content)
