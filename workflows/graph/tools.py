"""Agent tools over MemoryService, scoped to the calling agent and its user.

`recall` and `remember`, and the seeds' other memory tools: `forget`, `list_memories`,
`learn_procedure`, `record_episode` and `remind` (a reminder delivered later, workflows.conversations.reminders). Each acts for whoever the run's AgentContext names (the
workflow as agent, the identified user, the thread as session) and says what actually happened.
What a tool reads back from memory comes inside the same untrusted-hints block as recalled memory. Expected failures (bad arguments, missing rows,
database errors) go through one wrapper, `memory_tool`: logged, and returned to the model as an
error tool message (status "error"), never as a result.
"""

import functools
import json
import logging
import re
import threading

from django.db import DatabaseError, connection
from django.utils import timezone
from langchain_core.tools import StructuredTool, ToolException
from langgraph.prebuilt import ToolRuntime

from memory.asynchronous import off_the_loop
from memory.exceptions import InvalidMemoryArgument, MemoryServiceError
from memory.hints import clean_line, hints_block
from memory.models import ProcedureSource, Scope
from memory.rules.validation import importance_as_confidence
from memory.service import MemoryService, WriteAction

from ..conversations.reminders import schedule_reminder
from ..language.state import AgentContext
from .memory_access import MEMORY_TYPES as RECALL_TYPES
from .memory_access import RecallOptions, RecallScope, recall_for

logger = logging.getLogger("engram.workflows")

RECALL_DESCRIPTION = (
    "Look something up in long-term memory. With `key`: that fact (exact key, else a search). With "
    "`query`: facts, past conversations and procedures relevant to it; `top_k`: how many of each; "
    "`memory_types`: which of facts, episodes, procedures. With neither key nor query: every fact you can see. "
    "`valid_at` (an ISO date such as 2024-05-01): what held in the world then (where did she live in 2024?); "
    "`as_of` (an ISO date): what memory said at that time. Without them: what holds now."
)
REMEMBER_DESCRIPTION = (
    "Store a fact in long-term memory under `key` (for the user you are talking to, if known). "
    "`fact_type`: user_preference, world_knowledge, self_knowledge, correction or relationship; "
    "`tags`: a few labels; `importance`: 0.0 to 1.0 (0.8 and up for critical decisions). "
    "`valid_from` / `valid_to` (ISO dates, optional): when the value starts and stops holding in the world; "
    "a new value of the key ends the old one at its valid_from (today when not given)."
)
# The seeds' names of the memory types (semantic, episodic, procedural) read as Engram's.
TYPE_NAMES = {"facts": "facts", "episodes": "episodes", "procedures": "procedures"}
TYPE_NAMES |= {"semantic": "facts", "episodic": "episodes", "procedural": "procedures"}
DEFAULT_MAX_TOP_K = 20


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


def _period(fact):
    """ ", or " from <date> to <date>" for a fact (or a version) with a valid time."""
    start, end = fact.valid_time
    if start is None and end is None:
        return ""
    return f", valid {start.date().isoformat() if start else '...'} to {end.date().isoformat() if end else 'now'}"


def _allowed_types(config, default):
    """The memory types a tool may read: its config's `memory_types` (or legacy `memory_type`), less
    the types the agent node switched off (`disabled_types`, set by tools_for)."""
    types = config.get("memory_types", config.get("memory_type", default))
    types = [types] if isinstance(types, str) else list(types)
    allowed = RECALL_TYPES if "all" in types else tuple(t for t in RECALL_TYPES if t in types)
    return tuple(t for t in allowed if t not in config.get("disabled_types", ()))


def _call_types(memory_types, allowed):
    """The types one call asks for (None: every allowed one); InvalidMemoryArgument names the field."""
    if memory_types is None or memory_types == []:
        return allowed
    if isinstance(memory_types, str):
        memory_types = [memory_types]
    asked = []
    for name in memory_types:
        kind = TYPE_NAMES.get(str(name).strip().lower()) if isinstance(name, str) else None
        if kind is None:
            raise InvalidMemoryArgument("memory_types", f"{name!r} is not a memory type; use {', '.join(RECALL_TYPES)}")
        if kind not in allowed:
            raise InvalidMemoryArgument(
                "memory_types", f"{name!r} is not allowed here; this agent may recall {', '.join(allowed) or 'nothing'}"
            )
        if kind not in asked:
            asked.append(kind)
    return tuple(asked)


def make_recall_tool(config, *, bound=None):
    """The `recall` tool; config: memory_types (the types a call may ask for; legacy memory_type:
    facts, episodes, procedures, all), limit (a call's top_k when it gives none), max_top_k (the most
    a call may ask for, DEFAULT_MAX_TOP_K), min_confidence.

    `bound`: an AgentContext to act for when the run has none (a graph of your own)."""
    allowed = _allowed_types(config, "facts")
    max_top_k = int(config.get("max_top_k", DEFAULT_MAX_TOP_K))
    default_top_k = min(int(config.get("limit", 10)), max_top_k)
    min_confidence = float(config.get("min_confidence", 0.5))

    @memory_tool
    def recall(
        runtime: ToolRuntime[AgentContext],
        key: str = "",
        query: str = "",
        top_k: int = 0,
        memory_types: list[str] | None = None,
        valid_at: str = "",
        as_of: str = "",
    ) -> str:
        """Look something up in long-term memory."""
        if top_k in (0, None):
            top_k = default_top_k
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= max_top_k:
            raise InvalidMemoryArgument("top_k", f"must be 1 to {max_top_k}, got {top_k!r}")
        types = _call_types(memory_types, allowed)
        options = RecallOptions(memory_types=types, limit=top_k, min_confidence=min_confidence)
        scope = _scope(runtime, bound)
        service = MemoryService()
        viewer = {"agent_id": scope.agent_id, "user_id": scope.user_id, "session_id": scope.session_id}
        times = {"valid_at": valid_at.strip() or None, "as_of": as_of.strip() or None}
        if key.strip() and "facts" in types:
            fact = service.get_fact(key, **viewer, **times)
            if fact is not None and fact.confidence >= options.min_confidence:
                return (
                    f"{fact.key} = {_show(fact.value)} ({fact.scope}, confidence {fact.confidence:.2f}{_period(fact)})"
                )
        if key.strip():
            query = query or key.replace("_", " ")
        if any(times.values()):
            return _recall_at(service, query, viewer, times, options)
        if not query.strip():
            if "facts" not in types:
                return "Give a query to recall episodes or procedures."
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
        coroutine=off_the_loop(recall),
        name="recall",
        description=RECALL_DESCRIPTION,
        handle_tool_error=True,
    )


def _recall_at(service, query, viewer, times, options):
    """The recall tool's answer about another time: facts (and, with as_of, conversations) as they held then."""
    if not query.strip():
        raise InvalidMemoryArgument("query", "give a key or a query with valid_at or as_of")
    types = [t for t in ("facts", "episodes") if t in options.memory_types] or ["facts"]
    found = service.recall(
        query, **viewer, types=types, limit=options.limit, min_confidence=options.min_confidence, **times
    )
    when = " and ".join(f"{name} {value}" for name, value in times.items() if value)
    lines = [
        f"{h.item.key} = {_show(h.item.value)} ({h.item.scope}{_period(h.item)})" for h in found if h.kind == "fact"
    ]
    lines += [f"past conversation {h.item.started_at.date()}: {h.item.gist}" for h in found if h.kind == "episode"]
    return "\n".join(lines) if lines else f"Nothing in memory matches {query!r} at {when}."


def make_remember_tool(config, *, bound=None):
    """The `remember` tool; config: fact_type (default for facts given without one), overwrite,
    agent_scope_without_user (off: with no identified user the tool refuses rather than storing the
    words as the agent's own, where every other user of the agent would see them).

    A call's `importance` (0 to 1) is stored as the fact's confidence, which recall's ranking reads as
    a fact's importance (memory/recall/ranking.py); without one the fact gets MEMORY["DEFAULT_CONFIDENCE"]."""
    default_type = config.get("fact_type", "world_knowledge")
    overwrite = bool(config.get("overwrite", True))
    agent_scope_without_user = bool(config.get("agent_scope_without_user", False))

    @memory_tool
    def remember(
        runtime: ToolRuntime[AgentContext],
        key: str,
        value: str,
        fact_type: str = "",
        tags: list[str] | None = None,
        importance: float | None = None,
        valid_from: str = "",
        valid_to: str = "",
    ) -> str:
        """Store a fact in long-term memory."""
        scope = _scope(runtime, bound)
        if scope.user_id is None and not agent_scope_without_user:
            raise InvalidMemoryArgument(
                "user",
                "nobody is identified in this conversation, so nothing is stored "
                "(the agent's own memory would show it to every user)",
            )
        confidence = importance_as_confidence(importance)
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
            confidence=confidence,
            tags=tags,
            valid_from=valid_from.strip() or None,
            valid_to=valid_to.strip() or None,
            **owner,
        )
        whose = "this user" if owner["scope"] == Scope.USER else "this agent"
        if write.action == WriteAction.SKIPPED:
            return (
                f"Not stored: {key} already holds {_show(write.fact.value)} for {whose} and overwriting is off "
                "(counted as a contradiction)."
            )
        labels = f", tags {', '.join(write.fact.tags)}" if write.fact.tags else ""
        return (
            f"Remembered {write.fact.key} = {_show(write.fact.value)} for {whose} "
            f"({write.action}{labels}{_period(write.fact)})."
        )

    return StructuredTool.from_function(
        func=remember,
        coroutine=off_the_loop(remember),
        name="remember",
        description=REMEMBER_DESCRIPTION,
        handle_tool_error=True,
    )


FORGET_DESCRIPTION = (
    "Delete one memory you can see, by the id that list_memories shows (for example fact:12). "
    "Memories you cannot see cannot be deleted."
)
LIST_DESCRIPTION = (
    "List stored memories, newest first. `memory_type`: facts, episodes, procedures or all; `category`: "
    "a fact's type, an episode's category, a procedure's category; `limit`: 1 to 50."
)
LEARN_DESCRIPTION = (
    "Store a procedure, policy or pattern to follow in future runs (`content`), under `category`. "
    "An operator may need to activate it before it is used."
)
EPISODE_DESCRIPTION = (
    "Record what happened (an outcome, a decision, an error, an event) as an episode, under `category`."
)
MEMORY_TYPES = {"facts": ("fact",), "episodes": ("episode",), "procedures": ("procedure",)}
MEMORY_TYPES["all"] = ("fact", "episode", "procedure")
KIND_OF_TYPE = {"facts": "fact", "episodes": "episode", "procedures": "procedure"}
MAX_LIST = 50


def _category(value):
    """As the seeds sanitize it: lowercased, anything but letters and digits replaced by "_"."""
    category = re.sub(r"[^a-z0-9]+", "_", str(value or "").strip().lower()).strip("_")
    if not category:
        raise InvalidMemoryArgument("category", "must hold a letter or digit")
    return category[:50]


def _hints(lines):
    """What a tool read from memory, framed as recalled memory is: hints, never instructions."""
    return hints_block("", *lines)


def _tool(func, name, description):
    return StructuredTool.from_function(
        func=func,
        coroutine=off_the_loop(func),
        name=name,
        description=description,
        handle_tool_error=True,
    )


def make_forget_tool(config, *, bound=None):
    """The `forget` tool: deletes one memory the calling agent and user can see (MemoryService.forget_visible)."""
    disabled = {KIND_OF_TYPE[t] for t in config.get("disabled_types", ())}

    @memory_tool
    def forget(runtime: ToolRuntime[AgentContext], id: str) -> str:
        """Delete one memory you can see."""
        scope = _scope(runtime, bound)
        kind, _, number = str(id).strip().partition(":")
        if kind not in ("fact", "episode", "procedure") or not number.strip().isdigit():
            raise InvalidMemoryArgument("id", "must be a memory id as list_memories shows it, for example fact:12")
        if kind in disabled:
            raise InvalidMemoryArgument("id", f"{kind} memory is switched off for this agent")
        MemoryService().forget_visible(
            kind,
            int(number),
            agent_id=scope.agent_id,
            user_id=scope.user_id,
            session_id=scope.session_id,
            actor=f"forget tool of {scope.agent_id}",
        )
        return f"Forgot {kind}:{int(number)}."

    return _tool(forget, "forget", FORGET_DESCRIPTION)


def make_list_memories_tool(config, *, bound=None):
    """The `list_memories` tool; config: limit (the default number listed, 20)."""
    default_limit = int(config.get("limit", 20))
    disabled = {KIND_OF_TYPE[t] for t in config.get("disabled_types", ())}

    @memory_tool
    def list_memories(
        runtime: ToolRuntime[AgentContext], memory_type: str = "all", category: str = "", limit: int = 0
    ) -> str:
        """List stored memories, newest first."""
        scope = _scope(runtime, bound)
        kinds = MEMORY_TYPES.get(memory_type)
        if kinds is None:
            raise InvalidMemoryArgument("memory_type", f"must be one of {', '.join(MEMORY_TYPES)}")
        kinds = tuple(k for k in kinds if k not in disabled)
        if not kinds:
            raise InvalidMemoryArgument("memory_type", f"{memory_type} memory is switched off for this agent")
        limit = limit or default_limit
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST:
            raise InvalidMemoryArgument("limit", f"must be 1 to {MAX_LIST}")
        service = MemoryService()
        who = {"agent_id": scope.agent_id, "user_id": scope.user_id, "session_id": scope.session_id}
        lines = []
        for kind in kinds:
            items = service.list_visible(kind, category=category.strip() or None, limit=limit, **who)
            if kind == "fact":
                lines += [
                    f"[fact:{f.pk} {f.fact_type}] {clean_line(f.key)} = {clean_line(_show(f.value))}" for f in items
                ]
            elif kind == "episode":
                lines += [
                    f"[episode:{e.pk} {e.trigger_type or 'general'}] ({e.started_at:%Y-%m-%d}) {clean_line(e.gist or '(no summary)')}"
                    for e in items
                ]
            else:
                lines += [f"[procedure:{p.pk}] {clean_line(p.name)}: {clean_line(p.description)}" for p in items]
        return _hints(lines or ["(no memories of that kind)"])

    return _tool(list_memories, "list_memories", LIST_DESCRIPTION)


def make_learn_procedure_tool(config, *, bound=None):
    """The `learn_procedure` tool; config: activate (off: what an agent learns is stored inactive, for
    an operator to review and activate in /memories/, because an active procedure is followed in every
    later run of the agent, with every user: a user must not be able to teach it instructions)."""
    activate = bool(config.get("activate", False))

    @memory_tool
    def learn_procedure(runtime: ToolRuntime[AgentContext], content: str, category: str = "general") -> str:
        """Store a procedure, policy or pattern to follow in future runs."""
        scope = _scope(runtime, bound)
        category = _category(category)
        text = " ".join(str(content).split())
        if not text:
            raise InvalidMemoryArgument("content", "must not be blank")
        name = f"{category}/{text[: 200 - len(category) - 1]}"
        procedure = MemoryService().save_procedure(
            name,
            agent_id=scope.agent_id,
            description=text,
            content={"prompt": text},
            source=ProcedureSource.LEARNED,
            is_active=activate,
        )
        state = "active" if procedure.is_active else "stored inactive, until an operator activates it"
        return f"Learned procedure:{procedure.pk} in {category} ({state})."

    return _tool(learn_procedure, "learn_procedure", LEARN_DESCRIPTION)


def make_record_episode_tool(config, *, bound=None):
    """The `record_episode` tool: an episode of the calling agent and user, its category as trigger type."""

    @memory_tool
    def record_episode(runtime: ToolRuntime[AgentContext], content: str, category: str = "general") -> str:
        """Record what happened as an episode."""
        scope = _scope(runtime, bound)
        category = _category(category)
        text = str(content).strip()
        if not text:
            raise InvalidMemoryArgument("content", "must not be blank")
        episode = MemoryService().record_episode(
            started_at=timezone.now(),
            agent_id=scope.agent_id,
            user_id=scope.user_id,
            session_id=scope.session_id,
            trigger_type=category,
            summary=text,
            success=True,
        )
        return f"Recorded episode:{episode.pk} in {category}."

    return _tool(record_episode, "record_episode", EPISODE_DESCRIPTION)


REMIND_DESCRIPTION = (
    "Remind the user you are talking to of something later, through the channel they use. `when`: a "
    "time in the future, natural ('in 2 hours', 'tomorrow at 9am') or ISO 8601 (2026-05-01T09:00:00+00:00); "
    "`message`: what to remind them of, in the words they should read."
)


def make_remind_tool(config, *, bound=None):
    """The `remind` tool: a reminder for the identified user (workflows.conversations.reminders), delivered by the worker."""

    @memory_tool
    def remind(runtime: ToolRuntime[AgentContext], when: str, message: str) -> str:
        """Remind the user of something later."""
        scope = _scope(runtime, bound)
        reminder = schedule_reminder(
            user_id=scope.user_id,
            when=when,
            message=message,
            agent_id=scope.agent_id,
            thread_id=scope.session_id,  # the conversation's thread: the reminder goes back into it
        )
        due = timezone.localtime(reminder.due_at).isoformat(timespec="minutes")
        return f"Reminder:{reminder.pk} set for {due}."

    return _tool(remind, "remind", REMIND_DESCRIPTION)


# Every memory tool an agent node (or memory_tools) can enable, by name, in the order they are offered.
# The tools that write to memory: a turn that used one of them successfully resets the nudge count.
MEMORY_WRITE_TOOLS = frozenset({"remember", "forget", "learn_procedure", "record_episode"})

TOOLS = {
    "recall": make_recall_tool,
    "remember": make_remember_tool,
    "forget": make_forget_tool,
    "list_memories": make_list_memories_tool,
    "learn_procedure": make_learn_procedure_tool,
    "record_episode": make_record_episode_tool,
    "remind": make_remind_tool,
}


# The tools that write one memory type: not offered when the agent node switches the type off.
WRITES_TYPE = {"remember": "facts", "record_episode": "episodes", "learn_procedure": "procedures"}


def tools_for(tool_config, switches=None, *, bound=None):
    """The tools an agent node's `tools` config enables, in TOOLS order, with its per-type switches
    (`memory_types`: {"facts": false, ...}, as the seeds' semantic/episodic/procedural `enabled`)
    applied: a type switched off loses the tool that writes it, and no tool reads or deletes it."""
    disabled = tuple(t for t, on in (switches or {}).items() if on is False)
    return [
        make({**(tool_config[name] or {}), "disabled_types": disabled}, bound=bound)
        for name, make in TOOLS.items()
        if name in tool_config and WRITES_TYPE.get(name) not in disabled
    ]
