"""Agent tools `recall` and `remember` over MemoryService, scoped to the calling agent and its user.

Both act for whoever the run's AgentContext names (the workflow as agent, the identified user, the
thread as session) and say what actually happened. Expected failures (bad arguments, missing rows,
database errors) go through one wrapper, `memory_tool`: logged, and returned to the model as an
error tool message (status "error"), never as a result.
"""

import functools
import json
import logging
import threading

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connection
from langchain_core.tools import StructuredTool, ToolException
from langgraph.prebuilt import ToolRuntime

from memory.exceptions import InvalidMemoryArgument, MemoryServiceError
from memory.models import Scope
from memory.service import MemoryService, WriteAction

from .memory_access import RecallOptions, RecallScope, recall_for
from .state import AgentContext

logger = logging.getLogger("engram.workflows")

RECALL_DESCRIPTION = (
    "Look something up in long-term memory. With `key`: that fact (exact key, else a search). With "
    "`query`: facts, past conversations and procedures relevant to it. With neither: every fact you can see."
)
REMEMBER_DESCRIPTION = (
    "Store a fact in long-term memory under `key` (for the user you are talking to, if known). "
    "`fact_type`: user_preference, world_knowledge, self_knowledge, correction or relationship."
)


def memory_tool(func):
    """Turn the memory errors a tool expects into an error tool message, logged with the tool's name."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except (MemoryServiceError, DatabaseError) as exc:
            logger.warning("memory tool %s failed: %s", func.__name__, exc)
            raise ToolException(f"{func.__name__} failed: {exc}") from exc
        finally:
            # LangGraph's ToolNode runs tools in pooled worker threads; give back the database
            # connection such a thread opened, as Django does at the end of a request.
            if threading.current_thread() is not threading.main_thread() and not connection.in_atomic_block:
                connection.close()

    return wrapper


def _scope(runtime, bound=None):
    """Who the tool acts for: the run's AgentContext, else the identity the tool was made with."""
    context = runtime.context if isinstance(runtime.context, AgentContext) else bound
    if context is None:
        raise InvalidMemoryArgument("context", "the tool runs without an AgentContext and was made without an agent")
    user = context.user or {}
    return RecallScope(
        agent_id=context.agent_id,
        user_id=user.get("id"),
        session_id=context.session_id,
        channel=user.get("channel", ""),
    )


def _show(value):
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def make_recall_tool(config, *, bound=None):
    """The `recall` tool; config: memory_type (facts, episodes, procedures, all), limit, min_confidence.

    `bound`: an AgentContext to act for when the run has none (a graph of your own)."""
    options = RecallOptions.from_config({"memory_types": config.get("memory_type", "facts"), **config})

    @memory_tool
    def recall(runtime: ToolRuntime[AgentContext], key: str = "", query: str = "") -> str:
        """Look something up in long-term memory."""
        scope = _scope(runtime, bound)
        service = MemoryService()
        if key.strip():
            fact = service.get_fact(key, agent_id=scope.agent_id, user_id=scope.user_id, session_id=scope.session_id)
            if fact is not None and fact.confidence >= options.min_confidence:
                return f"{fact.key} = {_show(fact.value)} ({fact.scope}, confidence {fact.confidence:.2f})"
            query = query or key.replace("_", " ")
        if not query.strip():
            facts = service.list_facts(
                agent_id=scope.agent_id,
                user_id=scope.user_id,
                session_id=scope.session_id,
                min_confidence=options.min_confidence,
                limit=options.limit,
            )
            if not facts:
                return "No facts are stored that you can see."
            return "\n".join(f"{f.key} = {_show(f.value)} ({f.scope})" for f in facts)
        found = recall_for(query, scope, options, service=service)
        lines = [f"{f['key']} = {_show(f['value'])} ({f['scope']})" for f in found.facts if f["matched"]]
        lines += [f"past conversation {e['started_at'][:10]}: {e['summary']}" for e in found.episodes]
        lines += [f"procedure {p['name']}: {p['description'] or _show(p['content'])}" for p in found.procedures]
        if not lines:
            return f"Nothing in memory matches {query!r}."
        return "\n".join(lines)

    return StructuredTool.from_function(
        func=recall,
        coroutine=sync_to_async(recall, thread_sensitive=True),
        name="recall",
        description=RECALL_DESCRIPTION,
        handle_tool_error=True,
    )


def make_remember_tool(config, *, bound=None):
    """The `remember` tool; config: fact_type (default for facts given without one), overwrite,
    agent_scope_without_user (off: with no identified user the tool refuses rather than storing the
    words as the agent's own, where every other user of the agent would see them)."""
    default_type = config.get("fact_type", "world_knowledge")
    overwrite = bool(config.get("overwrite", True))
    agent_scope_without_user = bool(config.get("agent_scope_without_user", False))

    @memory_tool
    def remember(runtime: ToolRuntime[AgentContext], key: str, value: str, fact_type: str = "") -> str:
        """Store a fact in long-term memory."""
        scope = _scope(runtime, bound)
        if scope.user_id is None and not agent_scope_without_user:
            raise InvalidMemoryArgument(
                "user",
                "nobody is identified in this conversation, so nothing is stored "
                "(the agent's own memory would show it to every user)",
            )
        owner = (
            {"scope": Scope.USER, "user_id": scope.user_id}
            if scope.user_id is not None
            else {"scope": Scope.AGENT, "agent_id": scope.agent_id}
        )
        write = MemoryService().set_fact(
            key,
            value,
            fact_type=fact_type or default_type,
            overwrite=overwrite,
            provenance=f"remember tool of {scope.agent_id}",
            **owner,
        )
        whose = "this user" if owner["scope"] == Scope.USER else "this agent"
        if write.action == WriteAction.SKIPPED:
            return (
                f"Not stored: {key} already holds {_show(write.fact.value)} for {whose} and overwriting is off "
                "(counted as a contradiction)."
            )
        return f"Remembered {write.fact.key} = {_show(write.fact.value)} for {whose} ({write.action})."

    return StructuredTool.from_function(
        func=remember,
        coroutine=sync_to_async(remember, thread_sensitive=True),
        name="remember",
        description=REMEMBER_DESCRIPTION,
        handle_tool_error=True,
    )
