"""Procedures (procedural memory): how to do something, when it applies, how well it has worked. MemoryService delegates to it."""

from django.db import transaction
from django.db.models import F, FloatField
from django.db.models.functions import Cast
from django.utils import timezone

from ..exceptions import InvalidMemoryArgument, MemoryNotFound
from ..models import Procedure, ProcedureSource, ProcedureType, RecallKind
from ..models.workspaces import workspace_default
from ..rules.validation import (
    check_choice,
    check_json,
    check_limit,
    check_search,
    check_user_id,
    clean_text,
)
from . import limits
from .facts import MAX_SEARCH_LENGTH


class Procedures:
    """Procedures: saved, matched to a goal, scored by use; MemoryService builds it and delegates."""

    def __init__(self, backend, recall_index):
        self.backend = backend
        self.recall_index = recall_index

    def save_procedure(
        self,
        name,
        *,
        agent_id="",
        description="",
        trigger_conditions=None,
        procedure_type=ProcedureType.PROMPT_TEMPLATE,
        content=None,
        source=ProcedureSource.HUMAN,
        parent_id=None,
        is_active=True,
    ):
        """Create the procedure `name` of an agent ("" = shared by all agents), or replace its definition."""
        name = clean_text("name", name, max_length=200)
        defaults = {
            "description": clean_text("description", description, required=False),
            "trigger_conditions": check_trigger_conditions(trigger_conditions),
            "procedure_type": check_choice("procedure_type", procedure_type, ProcedureType),
            "content": check_json("content", {} if content is None else content),
            "source": check_choice("source", source, ProcedureSource),
            "parent_id": check_user_id("parent_id", parent_id, required=False),
            "is_active": bool(is_active),
        }
        agent_id = clean_text("agent_id", agent_id, required=False, max_length=128)
        parent = defaults["parent_id"]
        if parent is not None and not Procedure.objects.filter(pk=parent).exists():
            raise InvalidMemoryArgument("parent_id", f"no procedure with id {parent}")
        with transaction.atomic():
            # In the writer's workspace (outside any: the default one), where (agent, name) is unique.
            procedure, created = Procedure.objects.update_or_create(
                agent_id=agent_id, name=name, workspace_id=workspace_default(), defaults=defaults
            )
            self.recall_index.embed_for_recall(RecallKind.PROCEDURE, [procedure.pk])
            if created:
                limits.enforce_after_create(limits.PROCEDURES, procedure)
        return procedure

    def get_procedure(self, name, *, agent_id=""):
        """The agent's own procedure `name`, else the shared one; None if neither exists."""
        name = clean_text("name", name, max_length=200)
        agent_id = clean_text("agent_id", agent_id, required=False, max_length=128)
        return Procedure.objects.filter(name=name, agent_id__in={agent_id, ""}).order_by("-agent_id").first()

    def find_procedure(self, goal, context=None, *, agent_id=""):
        """The best active procedure whose trigger conditions hold for this goal and context, or None.

        `goal_contains`: at least one listed word occurs in the goal (case-insensitive);
        `context_has`: every listed key is in the context. Matching happens in the database; the
        agent's own procedures and shared ones compete on smoothed success rate, then use.
        """
        found = self.matching_procedures(goal, context, agent_id=agent_id, limit=1)
        return found[0] if found else None

    def matching_procedures(self, goal, context=None, *, agent_id="", limit=3):
        """The best `limit` active procedures whose trigger conditions hold (see find_procedure)."""
        if not isinstance(goal, str):
            raise InvalidMemoryArgument("goal", "must be a string")
        goal = check_search("goal", goal, max_words=None, max_length=MAX_SEARCH_LENGTH)
        if context is not None and not isinstance(context, dict):
            raise InvalidMemoryArgument("context", "must be a JSON object")
        agent_id = clean_text("agent_id", agent_id, required=False, max_length=128)
        return self.backend.matching_procedures(goal, list(context or {}), agent_id, check_limit(limit, 3))

    def record_procedure_use(self, procedure_id, *, success, duration_ms=None):
        """Count one use and its outcome; success rate and mean duration update in one statement."""
        if not isinstance(success, bool):
            raise InvalidMemoryArgument("success", "must be true or false")
        if duration_ms is not None and (
            isinstance(duration_ms, bool) or not isinstance(duration_ms, (int, float)) or duration_ms < 0
        ):
            raise InvalidMemoryArgument("duration_ms", "must be a non-negative number")
        won = 1 if success else 0
        used = Cast(F("times_used"), FloatField())
        changes = {
            "times_used": F("times_used") + 1,
            "times_succeeded": F("times_succeeded") + won,
            "times_failed": F("times_failed") + (1 - won),
            "success_rate": (Cast(F("times_succeeded"), FloatField()) + won) / (used + 1.0),
            "last_used": timezone.now(),
        }
        if duration_ms is not None:
            changes["avg_duration_ms"] = (F("avg_duration_ms") * used + float(duration_ms)) / (used + 1.0)
        if not Procedure.objects.filter(pk=procedure_id).update(**changes):
            raise MemoryNotFound("procedure", procedure_id)
        return Procedure.objects.get(pk=procedure_id)

    def deactivate_procedure(self, procedure_id):
        if not Procedure.objects.filter(pk=procedure_id).update(is_active=False):
            raise MemoryNotFound("procedure", procedure_id)

    def list_procedures(self, *, agent_id=None, active_only=False):
        qs = Procedure.objects.all()
        if agent_id is not None:
            qs = qs.filter(agent_id__in={clean_text("agent_id", agent_id, required=False, max_length=128), ""})
        if active_only:
            qs = qs.filter(is_active=True)
        return list(qs.order_by("name", "agent_id"))

    def latest_procedures(self, *, agent_id="", limit=3):
        """The `limit` active procedures of the agent (and shared ones) changed last, newest first."""
        agent_id = clean_text("agent_id", agent_id, required=False, max_length=128)
        qs = Procedure.objects.filter(is_active=True, agent_id__in={agent_id, ""})
        return list(qs.order_by("-updated_at", "-id")[: check_limit(limit, 3)])


def check_trigger_conditions(conditions):
    """{"goal_contains": [words], "context_has": [keys]}; empty lists are dropped (no condition)."""
    if conditions is None:
        return {}
    if not isinstance(conditions, dict):
        raise InvalidMemoryArgument("trigger_conditions", "must be a JSON object")
    unknown = set(conditions) - {"goal_contains", "context_has"}
    if unknown:
        raise InvalidMemoryArgument(
            "trigger_conditions", f"unknown condition(s) {sorted(unknown)}; use goal_contains, context_has"
        )
    cleaned = {}
    for name, items in conditions.items():
        if not isinstance(items, list) or not all(isinstance(i, str) and i.strip() for i in items):
            raise InvalidMemoryArgument("trigger_conditions", f"{name} must be a list of non-empty strings")
        if items:
            cleaned[name] = [i.strip().lower() if name == "goal_contains" else i.strip() for i in items]
    return cleaned
