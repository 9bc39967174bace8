"""Procedures that learn: propose procedures from repeated successful runs, evolve the ones that fail.

    report = MemoryService().learn_procedures()          # also run by MemoryService.consolidate
    report.proposed, report.evolved                      # what it wrote, every one inactive

Deterministic rules, no model needed:

- **Proposing.** Finished, successful episodes of the last PROCEDURE_LEARNING["LOOKBACK_DAYS"] are
  grouped by kind: agent, workflow (else trigger type), and the sequence of tools the run called
  (repeats in a row counted once). A kind seen in at least MIN_EPISODES episodes becomes a
  `tool_sequence` procedure named `learned/<workflow>/<tools>`, source `learned`, whose trigger
  conditions are the words at least half of those runs' first user messages share (at most
  MAX_TRIGGER_WORDS). A kind with a procedure of that name already (approved, pending or rejected) is
  left alone: an operator's decision stands.
- **Evolving.** An active procedure used at least EVOLVE_MIN_USES times whose success rate fell below
  EVOLVE_BELOW, and that has no child yet, gets one: source `evolved`, `parent` set, the same trigger
  conditions, steps from the most common tool sequence of the successful runs those conditions match
  (the parent's content when there are none), and the errors of the failed runs it matches under
  `avoid`.

Both write through MemoryService.save_procedure with `is_active=False`, as an agent's `learn_procedure`
does without `activate`: an active procedure steers every later run, so a person approves it first
(ticks "active" in the admin, or PATCHes `is_active` over the REST API).
"""

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import DatabaseError
from django.utils import timezone

from ..conf import memory_settings
from ..exceptions import MemoryServiceError
from ..models import Episode, Procedure, ProcedureSource, ProcedureType
from ..text import content_words, value_text, words

logger = logging.getLogger("engram.memory.procedure_learning")

_USER_ROLES = {"user", "human"}
MAX_NAME = 200


@dataclass
class ProcedureLearningReport:
    """What one pass proposed and evolved (each {"id", "name", "agent_id", ...}), and what failed."""

    proposed: list[dict] = field(default_factory=list)
    evolved: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self):
        return not self.errors

    def as_dict(self):
        return {"ok": self.ok, "proposed": self.proposed, "evolved": self.evolved, "errors": list(self.errors)}


def _slug(text, max_length=60):
    return "_".join(words(text, ascii_only=True))[:max_length].strip("_") or "run"


def tool_sequence(actions):
    """The tools a run called, in order, a tool repeated in a row counted once."""
    tools = []
    for action in actions or []:
        if isinstance(action, dict) and isinstance(action.get("tool"), str) and action["tool"].strip():
            tool = action["tool"].strip()
            if not tools or tools[-1] != tool:
                tools.append(tool)
    return tuple(tools)


def first_user_text(conversation, trigger_input):
    for message in conversation or []:
        if isinstance(message, dict) and str(message.get("role", "")).lower() in _USER_ROLES:
            return value_text(message.get("content", ""))
    return value_text(trigger_input) if trigger_input else ""


def shared_words(texts, limit):
    """Content words at least half of `texts` hold, the most common first (ties: first seen)."""
    counts = Counter()
    for text in texts:
        counts.update(list(dict.fromkeys(content_words(text))))
    need = max(1, (len(texts) + 1) // 2)
    return [w for w, n in counts.most_common() if n >= need][:limit]


def _recent_episodes(agent_id, conf):
    since = timezone.now() - timedelta(days=conf["LOOKBACK_DAYS"])
    qs = Episode.objects.filter(ended_at__isnull=False, success__isnull=False, started_at__gte=since)
    if agent_id is not None:
        qs = qs.filter(agent_id=agent_id)
    fields = ("id", "agent_id", "workflow", "trigger_type", "trigger_input", "conversation", "actions", "success")
    fields += ("error",)
    return list(qs.order_by("-started_at", "-id").values(*fields)[: conf["MAX_EPISODES"]])


def _matches(conditions, text):
    wanted = conditions.get("goal_contains") or []
    lowered = text.lower()
    return not wanted or any(w in lowered for w in wanted)


class ProcedureLearning:
    """Proposes and evolves procedures through the service's public calls (MemoryService.learn_procedures)."""

    def __init__(self, service):
        self.service = service

    def learn_procedures(self, *, agent_id=None):
        """One pass of both rules (for one agent, or every agent); never raises, failures are in the report."""
        report = ProcedureLearningReport()
        conf = memory_settings.PROCEDURE_LEARNING
        if not conf["ENABLED"]:
            return report
        try:
            episodes = _recent_episodes(agent_id, conf)
        except DatabaseError as exc:
            report.errors.append(f"episodes not read: {type(exc).__name__}: {exc}")
            return report
        self._propose(episodes, conf, report)
        self._evolve(episodes, agent_id, conf, report)
        if report.errors:
            logger.warning("procedure learning finished with failures: %s", report.errors)
        return report

    def _save(self, report, bucket, **fields):
        try:
            procedure = self.service.save_procedure(is_active=False, **fields)
        except (MemoryServiceError, DatabaseError) as exc:
            report.errors.append(f"{fields['name']}: {type(exc).__name__}: {exc}")
            return None
        bucket.append(
            {
                "id": procedure.pk,
                "name": procedure.name,
                "agent_id": procedure.agent_id,
                "parent_id": procedure.parent_id,
                "steps": (procedure.content or {}).get("steps", []),
                "trigger_conditions": procedure.trigger_conditions,
            }
        )
        return procedure

    def _propose(self, episodes, conf, report):
        kinds = defaultdict(list)
        for episode in episodes:
            tools = tool_sequence(episode["actions"])
            if episode["success"] and tools:
                label = episode["workflow"] or episode["trigger_type"] or "run"
                kinds[(episode["agent_id"], label, tools)].append(episode)
        for (agent_id, label, tools), runs in sorted(kinds.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
            if len(runs) < conf["MIN_EPISODES"]:
                continue
            name = f"learned/{_slug(label)}/{_slug('-'.join(tools), 120)}"[:MAX_NAME]
            if Procedure.objects.filter(agent_id=agent_id, name=name).exists():
                continue
            texts = [first_user_text(r["conversation"], r["trigger_input"]) for r in runs]
            goal_words = shared_words(texts, conf["MAX_TRIGGER_WORDS"])
            ids = sorted(r["id"] for r in runs)
            self._save(
                report,
                report.proposed,
                name=name,
                agent_id=agent_id,
                description=f"Learned from {len(runs)} successful runs of {label}: " + " → ".join(tools),
                trigger_conditions={"goal_contains": goal_words} if goal_words else {},
                procedure_type=ProcedureType.TOOL_SEQUENCE,
                content={"steps": [f"call {t}" for t in tools], "tools": list(tools), "learned_from": ids},
                source=ProcedureSource.LEARNED,
            )

    def _evolve(self, episodes, agent_id, conf, report):
        failing = Procedure.objects.filter(
            is_active=True,
            times_used__gte=conf["EVOLVE_MIN_USES"],
            success_rate__lt=conf["EVOLVE_BELOW"],
            children__isnull=True,
        )
        if agent_id is not None:
            failing = failing.filter(agent_id=agent_id)
        for parent in failing.order_by("id"):
            name = _child_name(parent)
            if Procedure.objects.filter(agent_id=parent.agent_id, name=name).exists():
                continue
            conditions = parent.trigger_conditions or {}
            matched = [
                e
                for e in episodes
                if (not parent.agent_id or e["agent_id"] == parent.agent_id)  # a shared one: every agent's runs
                and _matches(conditions, first_user_text(e["conversation"], e["trigger_input"]))
            ]
            sequences = Counter(tool_sequence(e["actions"]) for e in matched if e["success"])
            sequences.pop((), None)
            content = dict(parent.content) if isinstance(parent.content, dict) else {"previous": parent.content}
            procedure_type = parent.procedure_type
            if sequences:
                tools = sequences.most_common(1)[0][0]
                content.update({"steps": [f"call {t}" for t in tools], "tools": list(tools)})
                procedure_type = ProcedureType.TOOL_SEQUENCE
            errors = [e["error"] for e in matched if e["success"] is False and e["error"]]
            avoid = [err for err, _ in Counter(errors).most_common(3)]
            if avoid:
                content["avoid"] = avoid
            self._save(
                report,
                report.evolved,
                name=name,
                agent_id=parent.agent_id,
                description=(
                    f"Evolved from {parent.name}: its success rate fell to {parent.success_rate:.0%} "
                    f"over {parent.times_used} uses."
                ),
                trigger_conditions=conditions,
                procedure_type=procedure_type,
                content=content,
                source=ProcedureSource.EVOLVED,
                parent_id=parent.pk,
            )


def _child_name(parent):
    """`<name> (v2)` for a first evolution, `(v3)` for its child, and so on."""
    generation, ancestor, seen = 2, parent, {parent.pk}
    while ancestor.parent_id is not None and ancestor.parent_id not in seen and generation < 100:
        seen.add(ancestor.parent_id)
        ancestor = Procedure.objects.only("id", "parent_id").get(pk=ancestor.parent_id)
        generation += 1
    base = parent.name.rsplit(" (v", 1)[0] if parent.source == ProcedureSource.EVOLVED else parent.name
    suffix = f" (v{generation})"
    return base[: MAX_NAME - len(suffix)] + suffix
