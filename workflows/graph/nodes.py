"""The built-in node types: identify_user, recall, remember and agent, registered for the palette.

Nodes are plain callables over WorkflowState returning partial updates; they reach memory only
through MemoryService, each node that writes in one transaction (recall only reads: none). A memory
failure is logged and added to `memory_errors` in the state; it never raises out of the run and is
never reported as success.
"""

import logging
from datetime import datetime

from django.db import DatabaseError, transaction
from django.utils import timezone

from memory.exceptions import MemoryServiceError
from memory.models import FactType, Scope
from memory.rules.validation import importance_as_confidence, storable
from memory.service import MemoryService

from ..conf import workflow_settings
from ..conversations import threads
from ..exceptions import InvalidTrigger
from ..language.registry import NodeType, register
from ..language.state import last_human_text
from .agent import AGENT_SCHEMA, build_agent_node, check_agent_config
from .chat_models import get_chat_model
from .memory_access import (
    MEMORY_TYPES,
    RecallOptions,
    RecallScope,
    add_pins,
    fit_budget,
    recall_for,
    render_memory_prompt,
)
from .triggers import parse_trigger

logger = logging.getLogger("engram.workflows")

MEMORY_FAILURES = (MemoryServiceError, DatabaseError)


def _failure(node_id, operation, exc):
    logger.error("node %s: %s failed: %s", node_id, operation, exc)
    return {"node": node_id, "operation": operation, "error": str(exc)}


# ---------------------------------------------------------------- identify_user


def build_identify_user(config, context):
    def identify_user(state):
        try:
            trigger = parse_trigger(state.get("trigger"))
        except InvalidTrigger as exc:
            return {
                "user": None,
                "identity_failed": True,
                "memory_errors": [_failure(context.node_id, "identify_user", exc)],
            }
        try:
            # One transaction: the person, and the conversation thread they continue.
            with transaction.atomic():
                identified = MemoryService().identify(
                    trigger.channel, trigger.external_id, display_name=trigger.display_name
                )
                thread_id = _conversation_thread(context, state, identified, trigger.conversation_id)
        except MEMORY_FAILURES as exc:
            return {
                "user": None,
                "identity_failed": True,
                "conversation_id": trigger.conversation_id,
                "memory_errors": [_failure(context.node_id, "identify_user", exc)],
            }
        ctx = identified.context
        return {
            "user": {
                "id": ctx.user_id,
                "canonical_id": ctx.canonical_id,
                "display_name": ctx.display_name,
                "channel": trigger.channel,
                "external_id": trigger.external_id,
                "is_new": identified.created,
            },
            "conversation_id": trigger.conversation_id,
            "thread_id": thread_id,
            "user_context": ctx.as_dict(),
        }

    return identify_user


def _conversation_thread(context, state, identified, conversation_id):
    """The run's conversation thread: its session id, known from here on to recall, agent and remember.

    The one place a workflow run derives it (`<user>:<conversation>:<workflow>`, or the thread a merged
    user's conversation continues). A graph built in code (no workflow) runs on the thread its caller
    gave it (`workflows.langgraph.conversation`), which arrives in the state.
    """
    if context.workflow_id is None:
        return state.get("thread_id") or ""
    user_id = identified.context.user_id
    if identified.created:  # a new person has no thread yet: nothing to look up
        return threads.thread_id_for(user_id, conversation_id, context.workflow_id)
    return threads.thread_for(
        user_id=user_id, conversation_id=conversation_id, workflow_id=context.workflow_id
    ).thread_id


register(
    NodeType(
        name="identify_user",
        category="memory",
        description=(
            "Recognise who the trigger is from (Telegram sender, email, chat user id or name), creating "
            "the memory user if new and following merges; count the conversation and load their context; "
            "set `thread_id`, the conversation's thread and session id, before recall runs. "
            "When that fails, sets `identity_failed`: later memory nodes and tools then store nothing."
        ),
        config_schema={"type": "object", "properties": {}, "additionalProperties": False},
        inputs=("trigger",),
        outputs=("user", "identity_failed", "conversation_id", "thread_id", "user_context", "memory_errors"),
        build=build_identify_user,
    )
)


# ----------------------------------------------------------------------- recall

RECALL_SCHEMA = {
    "type": "object",
    "properties": {
        "memory_types": {
            "type": "array",
            "items": {"enum": [*MEMORY_TYPES, "all"]},
            "minItems": 1,
            "uniqueItems": True,
            "default": ["all"],
            "description": "Which memory to recall: facts, episodes, procedures, or all.",
        },
        "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10},
        "min_confidence": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.5},
        "max_memory_chars": {
            "type": ["integer", "null"],
            "minimum": 0,
            "maximum": 1000000,
            "description": (
                "Character budget of the memory lines put in the prompt: pinned memory always goes in, "
                "first; the rest by score while it fits; `recall_trace.cut` lists what was left out "
                "(null: WORKFLOWS['MAX_MEMORY_CHARS'])."
            ),
        },
        "latest_procedures": {
            "type": "integer",
            "minimum": 0,
            "maximum": 20,
            "default": 0,
            "description": "Also show the latest N active procedures on every run, whatever the message.",
        },
    },
    "additionalProperties": False,
}


def build_recall(config, context):
    options = RecallOptions.from_config({"memory_types": config.get("memory_types", ["all"]), **config})
    budget = config.get("max_memory_chars")
    if budget is None:
        budget = workflow_settings.MAX_MEMORY_CHARS

    def recall(state):
        user = state.get("user") or {}
        query = last_human_text(state)
        scope = RecallScope(
            agent_id=context.agent_id,
            user_id=user.get("id"),
            session_id=state.get("thread_id", ""),
            channel=user.get("channel", ""),
        )
        try:
            # Reads only: no transaction (on SQLite it would take the write lock), nothing to commit.
            recalled = fit_budget(add_pins(recall_for(query, scope, options), scope), budget)
        except MEMORY_FAILURES as exc:
            return {
                "memories": {"query": query, "facts": [], "episodes": [], "procedures": []},
                "memory_prompt": "",
                "recall_trace": {"query": query, "hits": [], "scopes": {}, "cut": []},
                "memory_errors": [_failure(context.node_id, "recall", exc)],
            }
        return {
            "memories": recalled.as_dict(),
            "memory_prompt": render_memory_prompt(recalled, state.get("user_context")),
            "recall_trace": recalled.trace(),
        }

    return recall


register(
    NodeType(
        name="recall",
        category="memory",
        description=(
            "Recall facts, past conversations and matching procedures for the last message, with every "
            "pinned fact and procedure first, within an optional character budget; sets `memories` and "
            "`memory_prompt` (an untrusted-hints block plus learned procedures), and `recall_trace` (each "
            "hit with its score, which scope won for each fact key, and what the budget cut)."
        ),
        config_schema=RECALL_SCHEMA,
        inputs=("messages", "user", "user_context", "thread_id"),
        outputs=("memories", "memory_prompt", "recall_trace", "memory_errors"),
        build=build_recall,
    )
)


# --------------------------------------------------------------------- remember

REMEMBER_SCHEMA = {
    "type": "object",
    "properties": {
        "scope": {"enum": list(Scope.values), "default": "user", "description": "Scope of facts given without one."},
        "team": {
            "type": "string",
            "description": "Scope team: the team of facts given without one (this agent must be a member).",
        },
        "fact_type": {"enum": list(FactType.values), "default": "world_knowledge"},
        "overwrite": {"type": "boolean", "default": True},
        "record_episode": {"type": "boolean", "default": True},
        "mode": {
            "enum": ["key_value", "extract"],
            "default": "key_value",
            "description": (
                "key_value: store the facts the agent hands over. extract: also, after the reply, have the "
                "chat model read the turn and add, update or delete facts against what is stored "
                "(MemoryService.observe); with no chat model configured, only the rule-based facts are stored."
            ),
        },
        "store_without_user": {
            "type": "boolean",
            "default": False,
            "description": (
                "When identify_user failed, still store agent, session and global facts and an episode "
                "without a user. Off: such a run stores nothing (its words may be anyone's)."
            ),
        },
    },
    "additionalProperties": False,
}


def build_remember(config, context):
    default_scope = config.get("scope", Scope.USER)
    default_team = config.get("team")
    default_type = config.get("fact_type", FactType.WORLD_KNOWLEDGE)
    overwrite = config.get("overwrite", True)
    record = config.get("record_episode", True)
    store_without_user = config.get("store_without_user", False)
    extract = config.get("mode", "key_value") == "extract"

    def remember(state):
        service = MemoryService()
        user = state.get("user") or {}
        facts = state.get("facts_to_remember") or []
        errors = list(state.get("memory_errors") or [])
        if state.get("identity_failed") and not store_without_user:
            return _refuse_unidentified(context, facts, default_scope)
        reports, writes, new_errors, episode_id = [], [], [], None
        try:
            with transaction.atomic():
                if record:
                    episode_id = _record_episode(service, state, context, user, errors).pk
                    writes.append({"kind": "episode", "action": "created", "id": episode_id, "key": None})
                for fact in facts:
                    report, fact_id = _write_fact(
                        service,
                        fact,
                        state,
                        context,
                        user,
                        default_scope,
                        default_type,
                        overwrite,
                        episode_id,
                        default_team=default_team,
                    )
                    reports.append(report)
                    writes.append({"kind": "fact", "id": fact_id, **report})
                    if report["action"] == "failed":
                        new_errors.append(_failure(context.node_id, f"remember {report['key']!r}", report["error"]))
                if new_errors and episode_id is not None:
                    service.mark_episode_failed(episode_id, "; ".join(e["error"] for e in new_errors))
        except MEMORY_FAILURES as exc:
            # Nothing of this node was committed: no fact is reported as written.
            failure = _failure(context.node_id, "remember", exc)
            return {
                "remembered": [
                    {
                        "key": str(f.get("key", "")) if isinstance(f, dict) else "",
                        "scope": str(f.get("scope") or default_scope) if isinstance(f, dict) else default_scope,
                        "action": "failed",
                        "error": str(exc),
                    }
                    for f in facts
                ],
                "episode_id": None,
                "memory_writes": [],
                "memory_errors": [failure],
            }
        if extract:
            # After the node's transaction has committed: the model is called outside it.
            observed_writes, observed_errors = _observe_turn(service, state, context, user, episode_id)
            writes += observed_writes
            new_errors += observed_errors
        return {"remembered": reports, "episode_id": episode_id, "memory_writes": writes, "memory_errors": new_errors}

    return remember


def _observe_turn(service, state, context, user, episode_id):
    """The `extract` mode: the chat model's facts from this turn, reconciled with the stored ones.

    (memory_writes entries, memory_errors entries). With no chat model configured there is nothing to
    add: the rule-based facts already came in `facts_to_remember`. Failures are reported, never raised:
    the turn stays answered.
    """
    model = get_chat_model()
    if model is None:
        return [], []
    turn = [{"role": "user", "content": last_human_text(state)}]
    if state.get("reply"):
        turn.append({"role": "assistant", "content": state["reply"]})
    try:
        report = service.observe(
            turn,
            user_id=user.get("id"),
            agent_id=context.agent_id,
            session_id=state.get("thread_id") or "",
            chat_model=model,
            episode_id=episode_id,
        )
    except MEMORY_FAILURES as exc:
        return [], [_failure(context.node_id, "observe", exc)]
    errors = [_failure(context.node_id, "observe", error) for error in report.errors]
    writes = []
    for decision in report.decisions:
        if decision.get("error"):
            errors.append(_failure(context.node_id, f"observe {decision['key']!r}", decision["error"]))
        elif decision["action"] != "none":
            writes.append(
                {
                    "kind": "fact",
                    "action": decision["write"],
                    "id": decision["fact_id"],
                    "key": decision["key"],
                    "decision": decision["action"],
                    "reason": decision["reason"],
                }
            )
    return writes, errors


def _refuse_unidentified(context, facts, default_scope):
    """Fail closed: the person behind this run is unknown, so their words are stored nowhere."""
    reason = "the user could not be identified: nothing of this run is stored (store_without_user is off)"
    refused = [
        {
            "key": str(f.get("key", "")) if isinstance(f, dict) else "",
            "scope": str(f.get("scope") or default_scope) if isinstance(f, dict) else default_scope,
            "action": "failed",
            "error": reason,
        }
        for f in facts
    ]
    return {
        "remembered": refused,
        "episode_id": None,
        "memory_writes": [],
        "memory_errors": [_failure(context.node_id, "remember", reason)],
    }


def _write_fact(
    service, fact, state, context, user, default_scope, default_type, overwrite, episode_id, *, default_team=None
):
    """(what happened to the fact, as `remembered` reports it; the fact's id, None when it failed)."""
    key = fact.get("key") if isinstance(fact, dict) else None
    scope = (fact.get("scope") if isinstance(fact, dict) else None) or default_scope
    report = {"key": str(key or ""), "scope": scope}
    if not isinstance(fact, dict) or "value" not in fact:
        return {**report, "action": "failed", "error": "facts_to_remember: each item needs key and value"}, None
    owners = {
        Scope.USER: {"user_id": user.get("id")},
        Scope.AGENT: {"agent_id": context.agent_id},
        Scope.SESSION: {"session_id": state.get("thread_id") or ""},
        # The team's fact, written by this agent: the service refuses an agent outside the team.
        Scope.TEAM: {
            "team": (fact.get("team") if isinstance(fact, dict) else None) or default_team,
            "agent_id": context.agent_id,
        },
        Scope.GLOBAL: {},
    }.get(scope)
    if owners is None:
        return {**report, "action": "failed", "error": f"scope: must be one of {', '.join(Scope.values)}"}, None
    if scope == Scope.USER and owners["user_id"] is None:
        return {**report, "action": "failed", "error": "scope: user scope needs an identified user"}, None
    if scope == Scope.SESSION and not owners["session_id"]:
        return {**report, "action": "failed", "error": "scope: session scope needs a conversation thread"}, None
    try:
        write = service.set_fact(
            key,
            fact["value"],
            scope=scope,
            fact_type=fact.get("fact_type") or default_type,
            confidence=importance_as_confidence(fact.get("importance")),
            tags=fact.get("tags"),
            overwrite=overwrite,
            source_episode_id=episode_id,
            provenance=f"workflow {context.workflow_slug}",
            **owners,
        )
    except MemoryServiceError as exc:  # bad arguments: this fact only; the others still go in
        return {**report, "action": "failed", "error": str(exc)}, None
    return {**report, "key": write.fact.key, "action": write.action}, write.fact.pk


def _record_episode(service, state, context, user, errors):
    text = last_human_text(state)
    reply = state.get("reply", "")
    trigger = state.get("trigger") or {}
    started = state.get("run_started_at")
    started_at = datetime.fromisoformat(started) if started else timezone.now()
    # What the model wrote is recorded as it was, but storable: a NUL in a tool argument must not lose the episode.
    conversation = storable(
        [{"role": "user", "content": text}] + ([{"role": "assistant", "content": reply}] if reply else [])
    )
    # No summary of this run: one derived from its messages would repeat them in the recall text
    # (Episode.gist shows the run in one line). The conversation's running summary, when the agent
    # updated it this turn, is of earlier turns that left the history: stored here so it outlives the
    # thread, and taken off the episode that held the one it replaced (one copy in recall).
    return service.record_episode(
        started_at=started_at,
        agent_id=context.agent_id,
        user_id=user.get("id"),
        session_id=state.get("thread_id", ""),
        workflow=context.workflow_slug,
        trigger_type=trigger.get("type", ""),
        trigger_input=trigger.get("payload") or {},
        conversation=conversation,
        actions=storable(list(state.get("actions") or [])),
        final_output=storable({"reply": reply}) if reply else None,
        success=bool(reply) and not errors,
        error=storable("; ".join(e["error"] for e in errors)),
        summary=storable(state.get("conversation_summary") or ""),
        replaces_summary=storable(state.get("replaced_summary") or ""),
    )


register(
    NodeType(
        name="remember",
        category="memory",
        description=(
            "Store `facts_to_remember` (key, value, fact_type, scope, team, tags, importance) for the identified user, the agent or "
            "the session, record the run's episode, and report per fact what happened; `memory_writes` lists "
            "each row written (kind, action, id, key). Mode `extract`: the chat model also reads the turn "
            "and adds, updates or deletes facts against what is stored."
        ),
        config_schema=REMEMBER_SCHEMA,
        inputs=(
            "facts_to_remember",
            "user",
            "thread_id",
            "messages",
            "reply",
            "actions",
            "trigger",
            "conversation_summary",
            "replaced_summary",
        ),
        outputs=("remembered", "episode_id", "memory_writes", "memory_errors"),
        build=build_remember,
    )
)


# ------------------------------------------------------------------------ agent

register(
    NodeType(
        name="agent",
        category="agents",
        description=(
            "A ReAct agent with the chat model from settings (the offline responder if none), optional "
            "memory tools (recall, remember, forget, list_memories, learn_procedure, record_episode, remind), and "
            "conversation memory per (user, conversation, workflow)."
        ),
        config_schema=AGENT_SCHEMA,
        inputs=("messages", "user", "conversation_id", "thread_id", "memory_prompt", "memories"),
        outputs=(
            "reply",
            "messages",
            "actions",
            "facts_to_remember",
            "conversation_summary",
            "replaced_summary",
            "memory_errors",
        ),
        build=build_agent_node,
        check=check_agent_config,
    )
)
