"""The agent node: LangChain's `create_agent` with memory tools, conversation memory and Engram's middleware.

With conversation memory on, the agent runs on the shared checkpointer under the thread of (memory
user, conversation, workflow) that identify_user put in the state (`thread_id`, also the session id
that recall, remember and the tools use), so a person continues the conversation on any linked
channel. The workflow run itself is not checkpointed: its thread is only known once identify_user has run.

Each model call gets one SystemMessage: the node's system prompt, the operator's words only. Recalled
memory (facts, earlier conversations, learned procedures: what users once said, so untrusted) goes
in a message of its own just before the latest human message, a HumanMessage named "memory" inside
its untrusted-context block: never in the most privileged place of the prompt, and never stored in
the conversation's history (it is added to each model call's input). With `system_prompt_fallback`,
the system prompt also travels as a HumanMessage with a stable id at the head of the history, for
providers that ignore the system role; the stable id makes each turn replace it rather than add another. History is trimmed to `history_limit` messages before every model call (the
stored history too) and never starts with an AI or tool message.

Summaries instead of forgetting (`summarize_history`, on by default): the turns that fall out of
the window are first folded into the thread's running summary (graph/summaries.py; the configured
chat model, or an extractive summary with the offline responder), kept in the checkpointed state,
shown to each model call inside the recalled-memory block, and given to the remember node for the
turn's episode when it changed. If summarizing fails, those turns are not trimmed (they stay in the
history until a summary holds them) and the failure is reported in `memory_errors`.

The memory nudge: the conversation's state counts the turns since the agent last wrote
to memory successfully (remember, forget, learn_procedure, record_episode); from `nudge_after_turns`
on, each model call's system message ends with a short reminder to store what is worth keeping,
until a write. The reminder is part of the model's input only, never of the checkpoint or episode.

Without a user, with conversation memory off, when the person's threads hold
WORKFLOWS["MAX_CHECKPOINT_BYTES_PER_USER"], or when the checkpointer fails (the last two reported in
`memory_errors`), the turn runs on the same agent without a checkpointer. The node holds no database
transaction while the model runs: LangGraph runs tools in worker threads with their own connections.
"""

import logging
import sqlite3
import uuid
from typing import NotRequired

import psycopg
from django.db import DatabaseError
from langchain.agents import AgentState, create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import (
    AIMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from memory.exceptions import LimitReached, PersonForgotten
from memory.models import FactType

from ..conf import workflow_settings
from ..conversations import threads, turns
from ..conversations.checkpointer import get_checkpointer
from ..exceptions import InvalidDefinition
from ..language.state import AgentContext, last_human_text
from .chat_models import get_chat_model
from .memory_access import MEMORY_TYPES
from .offline import FALLBACK_MESSAGE_ID, OfflineResponder, facts_in
from .summaries import summarize_with, summary_block
from .tools import MEMORY_WRITE_TOOLS, tools_for

logger = logging.getLogger("engram.workflows")

# What the checkpointers raise (they use sqlite3 and psycopg directly, not Django's database layer).
CHECKPOINT_ERRORS = (sqlite3.Error, psycopg.Error)

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant with a long-term memory. Use what you know about the person you talk to, "
    "and store what they tell you that is worth keeping."
)


def trim_history(messages, limit):
    """The last `limit` messages, starting at a human message (never an AI or tool message).

    The fallback system-prompt message is not counted and stays first. If the current turn alone is
    longer than `limit`, it is kept whole from its human message.
    """
    fallback = [m for m in messages if m.id == FALLBACK_MESSAGE_ID]
    rest = [m for m in messages if m.id != FALLBACK_MESSAGE_ID]
    window = rest[-limit:] if limit and len(rest) > limit else rest
    start = next((i for i, m in enumerate(window) if isinstance(m, HumanMessage)), None)
    if start is None:
        humans = [i for i, m in enumerate(rest) if isinstance(m, HumanMessage)]
        kept = rest[humans[-1] :] if humans else []
    else:
        kept = window[start:]
    return fallback + kept


MEMORY_MESSAGE_NAME = "memory"

NUDGE = (
    "Memory check: several turns of this conversation have passed without storing anything. If the person "
    "said something worth keeping (a fact about them, a preference, a decision), store it with your memory tools."
)


class AgentMemoryState(AgentState):
    # Turns of this conversation since the agent last wrote to memory (checkpointed with it).
    turns_without_memory_write: NotRequired[int]
    # The running summary of the turns trimmed out of the history (checkpointed: kept with the thread).
    conversation_summary: NotRequired[str]
    # This turn's only (set when it starts): the summary it started with, whether that changed, and
    # why summarizing failed.
    summary_before_turn: NotRequired[str]
    summary_updated: NotRequired[bool]
    summary_failures: NotRequired[list[str]]


def since_last_human(messages):
    """The messages after the latest human message: the current turn's model and tool messages."""
    last = max((i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=-1)
    return messages[last + 1 :]


def wrote_memory(messages):
    """Whether `messages` hold a successful result of a memory-writing tool."""
    return any(isinstance(m, ToolMessage) and m.name in MEMORY_WRITE_TOOLS and m.status == "success" for m in messages)


def dropped_by(messages, kept):
    """The messages of `messages` that trimming to `kept` leaves out."""
    kept_ids = {id(m) for m in kept}
    return [m for m in messages if id(m) not in kept_ids]


def with_memory(messages, memory_prompt):
    """`messages` with the recalled-memory block as a message of its own before the latest human message."""
    if not memory_prompt:
        return list(messages)
    last_human = max((i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=len(messages))
    block = HumanMessage(content=memory_prompt, name=MEMORY_MESSAGE_NAME)
    return [*messages[:last_human], block, *messages[last_human:]]


class EngramAgentMiddleware(AgentMiddleware):
    """The agent's memory around each model call: the history trimmed to `history_limit` (the stored
    one too), the node's system prompt (with the memory nudge when it is due), the recalled-memory
    block as a message of its own, and, with no chat model configured, the offline responder
    answering from this turn's memory."""

    state_schema = AgentMemoryState

    def __init__(self, history_limit, offline, nudge_after=None, summarizer=None, summarize=True):
        super().__init__()
        self.history_limit = history_limit
        self.offline = offline
        self.nudge_after = nudge_after  # None: no nudge
        self.summarize = summarize
        self.summarizer = summarizer  # the chat model that writes summaries; None: extractive

    def before_agent(self, state, runtime):
        return {
            "summary_updated": False,
            "summary_failures": [],
            "summary_before_turn": state.get("conversation_summary", ""),
        }

    def after_agent(self, state, runtime):
        if not self.nudge_after:
            return None
        if wrote_memory(since_last_human(state["messages"])):
            return {"turns_without_memory_write": 0}
        return {"turns_without_memory_write": state.get("turns_without_memory_write", 0) + 1}

    def before_model(self, state, runtime):
        messages = state["messages"]
        kept = trim_history(messages, self.history_limit)
        trimmed = {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *kept]}
        dropped = dropped_by(messages, kept)
        if not dropped or not self.summarize:
            return trimmed
        if state.get("summary_failures"):
            return None  # it failed earlier this turn: keep the turns, without calling it again
        try:
            summary = summarize_with(self.summarizer, state.get("conversation_summary", ""), dropped)
        except Exception as exc:  # noqa: BLE001  (any failure of any chat model: keep the turns, report it)
            logger.error("agent: summarizing %d trimmed messages failed, keeping them: %s", len(dropped), exc)
            return {"summary_failures": [f"{type(exc).__name__}: {exc}"]}
        return {**trimmed, "conversation_summary": summary, "summary_updated": True}

    def wrap_model_call(self, request, handler):
        context = request.runtime.context
        system_prompt = context.system_prompt
        if (
            self.nudge_after
            and request.state.get("turns_without_memory_write", 0) >= self.nudge_after
            and not wrote_memory(since_last_human(request.messages))
        ):
            system_prompt = f"{system_prompt}\n\n{NUDGE}"
        summary = request.state.get("conversation_summary", "")
        memory_prompt = "\n\n".join(block for block in (summary_block(summary), context.memory_prompt) if block)
        changes = {
            "system_message": SystemMessage(content=system_prompt),
            "messages": with_memory(request.messages, memory_prompt),
        }
        if self.offline:
            changes["model"] = OfflineResponder(memories=context.memories, user=context.user, summary=summary)
        return handler(request.override(**changes))


def build_agent_graph(config, model, checkpointer=None):
    """The compiled agent (LangChain's create_agent) for one agent node (model None: the offline responder)."""
    # The offline responder never calls tools: leave them (and the tool node) out.
    tool_config = (config.get("tools") or {}) if model is not None else {}
    tools = tools_for(tool_config, config.get("memory_types"))
    limit = config.get("history_limit", workflow_settings.HISTORY_LIMIT)
    # The nudge asks the agent to use a tool it has: only agents that can write to memory get it.
    nudge_after = config.get("nudge_after_turns") or workflow_settings.NUDGE_AFTER_TURNS
    if not MEMORY_WRITE_TOOLS & set(tool_config):
        nudge_after = None
    middleware = EngramAgentMiddleware(
        limit,
        offline=model is None,
        nudge_after=nudge_after,
        summarizer=model,
        summarize=config.get("summarize_history", True),
    )
    return create_agent(
        model if model is not None else OfflineResponder(),
        tools,
        middleware=[middleware],
        context_schema=AgentContext,
        checkpointer=checkpointer,
        name="agent",
    )


# The agent graph's last node: a state written as if by it leaves nothing to run next.
LAST_NODE = f"{EngramAgentMiddleware.__name__}.after_agent"


def write_to_thread(thread_id, message):
    """Add `message` to a conversation thread's checkpointed history, so the next turn sees it.

    Written as the agent graph's last node, under the thread's turn lock (a turn in progress finishes
    first, and its checkpoint does not drop the message). A message whose id is in the history
    already replaces it (LangGraph's add_messages), so writing one twice adds it once.
    """
    graph = build_agent_graph({}, None, get_checkpointer())  # every agent's threads share this state's shape
    with turns.one_turn_at_a_time(thread_id):
        graph.update_state({"configurable": {"thread_id": thread_id}}, {"messages": [message]}, as_node=LAST_NODE)


def build_agent_node(config, context):
    """The node callable for an `agent` node (its graphs are built on first use, then reused)."""
    memory_on = config.get("conversation_memory", True)
    fallback_on = config.get("system_prompt_fallback", False)
    base_prompt = config.get("system_prompt") or DEFAULT_SYSTEM_PROMPT
    built = {}

    def graph(remembering):
        """The agent on the shared checkpointer (remembering) or without one; built once each."""
        if "offline" not in built:
            built["model"] = get_chat_model()
            built["offline"] = built["model"] is None
        key = "remembering" if remembering else "stateless"
        if key not in built:
            built[key] = build_agent_graph(config, built["model"], get_checkpointer() if remembering else None)
        return built[key]

    def agent(state):
        user = state.get("user")
        conversation_id = state.get("conversation_id") or "direct"
        # The conversation's thread, as identify_user found it: the checkpoint thread and the session.
        thread_id = state.get("thread_id") or ""
        system_prompt = base_prompt
        text = last_human_text(state)
        turn = HumanMessage(content=text, id=f"turn-{uuid.uuid4().hex}")
        messages = [turn]
        if fallback_on:
            messages.insert(0, HumanMessage(content=f"[system]\n{system_prompt}", id=FALLBACK_MESSAGE_ID))
        update = {"memory_errors": []}
        result = None
        limit = {"recursion_limit": workflow_settings.AGENT_RECURSION_LIMIT}
        run_context = _agent_context(context, user, thread_id, system_prompt, state)
        if memory_on and user and thread_id:
            # One turn at a time per conversation: two quick messages must not both continue the same checkpoint.
            with turns.one_turn_at_a_time(thread_id):
                thread_ref = None
                try:
                    # Read inside the lock: the checkpoints counted so far, after any earlier turn's.
                    thread_ref = threads.thread_ref(thread_id)
                    threads.check_checkpoint_room(user["id"])
                except LimitReached as exc:
                    # The person's conversations are at their cap: this turn is answered, not kept.
                    logger.warning("agent %s: %s", context.node_id, exc)
                    update["memory_errors"].append(_error(context, "conversation memory", exc))
                    thread_ref = None
                except DatabaseError as exc:
                    logger.error("agent %s: could not look up the conversation thread: %s", context.node_id, exc)
                    update["memory_errors"].append(_error(context, "thread lookup", exc))
                if thread_ref is not None:
                    try:
                        result = graph(remembering=True).invoke(
                            {"messages": messages},
                            {**limit, "configurable": {"thread_id": thread_id}},
                            context=run_context,
                            durability=workflow_settings.CHECKPOINT_DURABILITY,
                        )
                    except PersonForgotten as exc:
                        # Forgotten on some server while this turn ran: its checkpoint writes were refused
                        # from then on, and the forget deleted the ones before. Answered without memory.
                        logger.warning("agent %s: %s; answering without conversation memory", context.node_id, exc)
                        update["memory_errors"].append(_error(context, "conversation memory", exc))
                    except CHECKPOINT_ERRORS as exc:
                        # Conversation memory is out of order: say so, and answer this turn without it.
                        logger.error(
                            "agent %s: conversation memory failed, answering without it: %s", context.node_id, exc
                        )
                        update["memory_errors"].append(_error(context, "conversation memory", exc))
                    else:
                        _track(thread_ref, context, user, conversation_id, update)
        if result is None:
            # No user, conversation memory off, or the checkpointer failed: no history kept for this turn
            # (the session is still the conversation's: tools write session facts under its thread id).
            result = graph(remembering=False).invoke({"messages": messages}, limit, context=run_context)
        produced = _this_turn(result["messages"], turn.id)
        reply = next((m.text for m in reversed(produced) if isinstance(m, AIMessage) and m.text), "")
        update.update(
            reply=reply,
            messages=[AIMessage(content=reply)],
            actions=episode_actions(produced),
        )
        if built["offline"]:
            update["facts_to_remember"] = facts_in(text)
        _summary_outcome(result, context, update)
        return update

    return agent


def _summary_outcome(result, context, update):
    """This turn's summary for the run's episode (when it changed), and its failures in `memory_errors`."""
    if result.get("summary_updated"):
        update["conversation_summary"] = result.get("conversation_summary", "")
        update["replaced_summary"] = result.get("summary_before_turn", "")
    for failure in result.get("summary_failures") or []:
        error = f"{failure}; the turns past history_limit are kept until a summary holds them"
        update["memory_errors"].append(_error(context, "conversation summary", error))


def _agent_context(context, user, session_id, system_prompt, state):
    return AgentContext(
        agent_id=context.agent_id,
        user=user,
        session_id=session_id,
        system_prompt=system_prompt,
        memory_prompt=state.get("memory_prompt") or "",
        memories=state.get("memories") or {},
    )


def _track(thread_ref, context, user, conversation_id, update):
    """Count the turn on the thread's row (inside the thread's turn lock, so counts stay exact)."""
    try:
        threads.record_activity(
            thread_ref,
            workflow_id=context.workflow_id,
            user_id=user["id"],
            conversation_id=conversation_id,
            channel=user.get("channel", ""),
        )
    except PersonForgotten as exc:  # logged by record_activity, which deleted the turn's checkpoints
        update["memory_errors"].append(_error(context, "thread tracking", exc))
    except (DatabaseError, *CHECKPOINT_ERRORS) as exc:
        logger.error("agent %s: could not track thread %s: %s", context.node_id, thread_ref.thread_id, exc)
        update["memory_errors"].append(_error(context, "thread tracking", exc))


def _this_turn(messages, turn_id):
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].id == turn_id:
            return messages[i + 1 :]
    return messages[-1:]


def episode_actions(messages):
    """This turn's tool calls with their results, for the run's episode."""
    results = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    actions = []
    for message in messages:
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                result = results.get(call["id"])
                actions.append(
                    {
                        "tool": call["name"],
                        "args": call["args"],
                        "result": result.text if result is not None else None,
                        "status": getattr(result, "status", None) if result is not None else "not run",
                    }
                )
    return actions


def _error(context, operation, exc):
    return {"node": context.node_id, "operation": operation, "error": str(exc)}


# The agent node's config: its JSON Schema (the builder's form) and the check the schema cannot make.
AGENT_SCHEMA = {
    "type": "object",
    "properties": {
        "system_prompt": {"type": "string", "maxLength": 20000},
        "conversation_memory": {"type": "boolean", "default": True},
        "history_limit": {"type": "integer", "minimum": 2, "maximum": 1000, "default": 20},
        "summarize_history": {
            "type": "boolean",
            "default": True,
            "description": (
                "Fold the turns that fall out of history_limit into the thread's running summary (shown to the "
                "model as memory, stored on the turn's episode) instead of dropping them."
            ),
        },
        "nudge_after_turns": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": 1000,
            "description": (
                "After this many turns of the conversation without a memory write, the next turn's system "
                "prompt reminds the agent to store what is worth keeping (null: WORKFLOWS['NUDGE_AFTER_TURNS'])."
            ),
        },
        "system_prompt_fallback": {
            "type": "boolean",
            "default": False,
            "description": "Also send the system prompt as a stable-id human message (providers that ignore the system role).",
        },
        "memory_types": {
            "type": "object",
            "properties": {t: {"type": "boolean", "default": True} for t in MEMORY_TYPES},
            "additionalProperties": False,
            "description": (
                "Per-type switches (facts, episodes, procedures): a type switched off loses the tool that "
                "writes it (remember, record_episode, learn_procedure), and recall, list_memories and forget "
                "leave it out."
            ),
        },
        "tools": {
            "type": "object",
            "properties": {
                "recall": {
                    "type": ["object", "null"],
                    "properties": {
                        "memory_type": {"enum": [*MEMORY_TYPES, "all"], "default": "facts"},
                        "memory_types": {
                            "type": "array",
                            "items": {"enum": [*MEMORY_TYPES, "all"]},
                            "minItems": 1,
                            "uniqueItems": True,
                            "description": "The types a call may ask for (its `memory_types`); replaces memory_type.",
                        },
                        "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10},
                        "max_top_k": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": 100,
                            "default": 20,
                            "description": "The largest `top_k` a call may ask for; `limit` is a call's default.",
                        },
                        "min_confidence": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.5},
                    },
                    "additionalProperties": False,
                },
                "remember": {
                    "type": ["object", "null"],
                    "properties": {
                        "fact_type": {"enum": list(FactType.values), "default": "world_knowledge"},
                        "overwrite": {"type": "boolean", "default": True},
                        "agent_scope_without_user": {
                            "type": "boolean",
                            "default": False,
                            "description": (
                                "With no identified user, store facts as the agent's own (seen by every "
                                "user of the agent). Off: the tool refuses, so one person's words never "
                                "reach another."
                            ),
                        },
                    },
                    "additionalProperties": False,
                },
                "forget": {"type": ["object", "null"], "properties": {}, "additionalProperties": False},
                "list_memories": {
                    "type": ["object", "null"],
                    "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 20}},
                    "additionalProperties": False,
                },
                "learn_procedure": {
                    "type": ["object", "null"],
                    "properties": {
                        "activate": {
                            "type": "boolean",
                            "default": False,
                            "description": (
                                "Use what the agent learns at once. Off: it is stored inactive until an operator "
                                "activates it, since an active procedure steers every later run, with every user."
                            ),
                        }
                    },
                    "additionalProperties": False,
                },
                "record_episode": {"type": ["object", "null"], "properties": {}, "additionalProperties": False},
                "remind": {"type": ["object", "null"], "properties": {}, "additionalProperties": False},
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}


def check_agent_config(config):
    """What the schema cannot say: a fallback prompt needs a thread to keep it across turns."""
    if config.get("system_prompt_fallback") and not config.get("conversation_memory", True):
        # Without a thread there is nothing to keep it stable across; it would only repeat the prompt.
        raise InvalidDefinition(
            "config.system_prompt_fallback needs conversation_memory", field="config.system_prompt_fallback"
        )
