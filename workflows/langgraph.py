"""Engram's memory in a LangGraph graph of your own: nodes, tools and tracked conversations.

    from workflows.langgraph import conversation, get_checkpointer, identify_user, memory_tools, recall, remember

The node factories (usable with `invoke` and with `ainvoke`, which never blocks the event loop) are the built-in nodes a workflow definition uses (workflows/graph/nodes.py), for a
`StateGraph` you build in code. Each reads and writes the state keys Engram's workflows use
(`trigger`, `messages`, `user`, `memories`, `memory_prompt`, `facts_to_remember`, `remembered`,
`memory_errors`, ...); `keys={"engram key": "your key"}` renames any of them, and a key mapped to
None is neither read nor written. Memory failures are logged and reported under `memory_errors`
(declare it in your state, as `Annotated[list, operator.add]`, to see them there).

`memory_tools(agent_id=..., user_id=...)` gives the `recall` and `remember` tools bound to one agent
and user, for `create_agent` (or any agent running LangChain tools) without any context schema.

`EngramMemoryMiddleware(agent_id=...)` is the same memory for an agent of LangChain's `create_agent`:
recall before each model call for the user in the run's context, the episode recorded after it
(workflows/middleware.py).

`conversation(graph_name, user_id=...)` is how a graph of your own on Engram's shared checkpointer
(`get_checkpointer()`) keeps its conversations: it takes the conversation's turn lock, yields the
config to invoke with, and tracks the thread afterwards, so the conversation is listed in the
Checkpoints tab and the REST API, kept within the thread limits, and deleted with the person.

The thread a graph runs on (`config["configurable"]["thread_id"]`, the one `conversation()` gives)
is its session: `identify_user` puts it in the state as `thread_id` (unless the state has one), and
`recall` and `remember` read it from there, else from the config, so session-scoped facts are
recalled in the same conversation, and only there.
"""

import contextlib
import logging

from django.db import DatabaseError
from langchain_core.messages import AIMessage, HumanMessage, convert_to_messages
from langchain_core.runnables import RunnableLambda

from memory.asynchronous import off_the_loop
from memory.exceptions import InvalidMemoryArgument, PersonForgotten
from memory.rules.validation import check_user_id, clean_text
from memory.service import MemoryService

from .conversations import threads, turns
from .conversations.checkpointer import get_checkpointer
from .graph.chat_models import get_chat_model
from .graph.nodes import build_identify_user, build_recall, build_remember
from .graph.offline import OfflineResponder
from .graph.tools import TOOLS
from .language.registry import BuildContext
from .language.state import AgentContext
from .middleware import EngramMemoryMiddleware

__all__ = [
    "EngramMemoryMiddleware",
    "chat_model",
    "conversation",
    "get_checkpointer",
    "identify_user",
    "memory_tools",
    "recall",
    "remember",
]

logger = logging.getLogger("engram.workflows")

_IDENTIFY_READS = ("trigger", "thread_id")
_IDENTIFY_WRITES = ("user", "identity_failed", "conversation_id", "thread_id", "user_context", "memory_errors")
_RECALL_READS = ("messages", "user", "user_context", "thread_id")
_RECALL_WRITES = ("memories", "memory_prompt", "memory_errors")
_REMEMBER_READS = (
    "messages",
    "user",
    "identity_failed",
    "facts_to_remember",
    "memory_errors",
    "thread_id",
    "reply",
    "actions",
    "trigger",
    "run_started_at",
)
_REMEMBER_WRITES = ("remembered", "episode_id", "memory_errors")


def identify_user(*, keys=None):
    """A node: the memory user behind state["trigger"] ({"type": "chat", "payload": {"user_id": ...,
    "message": ...}}, or a Telegram update), created if new, with their context."""
    return _adapted(build_identify_user({}, _context("", "identify_user")), _IDENTIFY_READS, _IDENTIFY_WRITES, keys)


def recall(*, agent_id, memory_types=("all",), limit=10, min_confidence=0.5, keys=None):
    """A node: what `agent_id` remembers about the last human message, for the identified user."""
    config = {"memory_types": list(memory_types), "limit": limit, "min_confidence": min_confidence}
    return _adapted(build_recall(config, _context(agent_id, "recall")), _RECALL_READS, _RECALL_WRITES, keys)


def remember(
    *,
    agent_id,
    scope="user",
    fact_type="world_knowledge",
    overwrite=True,
    record_episode=True,
    store_without_user=False,
    keys=None,
):
    """A node: store state["facts_to_remember"] ([{"key", "value", ...}]) and record the turn as an episode
    (its reply: state["reply"], else the turn's last AI message in state["messages"])."""
    config = {
        "scope": scope,
        "fact_type": fact_type,
        "overwrite": overwrite,
        "record_episode": record_episode,
        "store_without_user": store_without_user,
    }
    node = build_remember(config, _context(agent_id, "remember"))

    def remember(state):
        # A graph of your own answers with an AI message, not Engram's `reply` key: the turn's last
        # AI message is its reply, so the episode holds it (and counts as a success).
        if not state.get("reply"):
            state = {**state, "reply": reply_in(state.get("messages") or [])}
        return node(state)

    return _adapted(remember, _REMEMBER_READS, _REMEMBER_WRITES, keys)


def reply_in(messages):
    """The text of the last AI message after the latest human message ('' if none)."""
    messages = convert_to_messages(messages)
    last_human = max((i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=-1)
    return next((m.text for m in reversed(messages[last_human + 1 :]) if isinstance(m, AIMessage) and m.text), "")


def memory_tools(
    *, agent_id, user_id=None, session_id="", recall_config=None, remember_config=None, names=None, configs=None
):
    """The agent tools, acting for `agent_id` and the memory user `user_id`: [recall, remember], or
    those `names` of workflows.graph.tools.TOOLS (recall, remember, forget, list_memories, learn_procedure,
    record_episode, remind), each with its config from `configs` (recall_config and remember_config as before)."""
    bound = AgentContext(
        agent_id=clean_text("agent_id", agent_id, max_length=128),
        user=None if user_id is None else {"id": check_user_id("user_id", user_id, required=True)},
        session_id=clean_text("session_id", session_id, required=False, max_length=128),
    )
    names = ("recall", "remember") if names is None else tuple(names)
    unknown = [n for n in names if n not in TOOLS]
    if unknown:
        raise InvalidMemoryArgument("names", f"unknown tool(s) {unknown}; choose from {', '.join(TOOLS)}")
    configs = {"recall": recall_config or {"memory_type": "all"}, "remember": remember_config or {}, **(configs or {})}
    return [TOOLS[name](configs.get(name) or {}, bound=bound) for name in names]


def chat_model():
    """The chat model Engram's agents use: WORKFLOWS["CHAT_MODEL"], or the offline responder without one."""
    return get_chat_model() or OfflineResponder()


@contextlib.contextmanager
def conversation(graph, *, user_id, conversation_id="direct", channel=""):
    """Run one turn of `user_id`'s conversation with the graph named `graph` on the shared checkpointer.

        with conversation("support-graph", user_id=ada.pk) as config:
            graph.invoke({"messages": [("user", "hi")]}, config)

    One turn at a time per conversation (a second caller waits); after the turn the thread is
    tracked: its checkpoints counted, the thread listed for operators and within the limits. When the
    person's threads hold WORKFLOWS["MAX_CHECKPOINT_BYTES_PER_USER"], raises LimitReached (memory's
    exceptions) before the turn: run it without the checkpointer, or make room.
    """
    graph = clean_text("graph", graph, max_length=100)
    conversation_id = clean_text("conversation_id", conversation_id, max_length=100)
    user = MemoryService().resolve_user(check_user_id("user_id", user_id, required=True))
    key = threads.thread_id_for(user.pk, conversation_id, graph=graph)
    with turns.one_turn_at_a_time(key):
        ref = threads.thread_for(user_id=user.pk, conversation_id=conversation_id, graph=graph)
        threads.check_checkpoint_room(user.pk)  # LimitReached: the person's threads are at their cap
        yield {"configurable": {"thread_id": ref.thread_id}}
        try:
            threads.record_activity(ref, user_id=user.pk, conversation_id=conversation_id, channel=channel, graph=graph)
        except PersonForgotten:  # logged by record_activity, which deleted this turn's checkpoints
            raise
        except DatabaseError as exc:
            logger.error("conversation %s: could not track thread %s: %s", graph, ref.thread_id, exc)
            raise


def _context(agent_id, node_id):
    if node_id != "identify_user":
        clean_text("agent_id", agent_id, max_length=128)
    return BuildContext(workflow_id=None, workflow_slug=agent_id, node_id=node_id)


def _adapted(node, reads, writes, keys):
    """`node` reading and writing the caller's state keys (`keys`: Engram's name -> theirs, or None).

    A Runnable with both forms: `invoke` runs it in the caller's thread; `ainvoke` / `astream` run it
    on Django's sync worker thread (asgiref), so the event loop never waits for a query or a model.
    """
    keys = dict(keys or {})
    unknown = set(keys) - set(reads) - set(writes)
    if unknown:
        raise InvalidMemoryArgument(
            "keys", f"unknown state key(s) {sorted(unknown)}; known: {sorted({*reads, *writes})}"
        )
    outer = {name: keys.get(name, name) for name in {*reads, *writes}}

    def run(state, config):
        inner = {name: state[outer[name]] for name in reads if outer[name] is not None and outer[name] in state}
        if "thread_id" in reads and outer["thread_id"] is not None and not inner.get("thread_id"):
            # The session is the conversation the graph runs on: the thread `conversation()` gave.
            inner["thread_id"] = ((config or {}).get("configurable") or {}).get("thread_id") or ""
        update = node(inner)
        return {outer[name]: value for name, value in update.items() if outer.get(name) is not None}

    async def arun(state, config):
        return await off_the_loop(run)(state, config)

    run.__name__ = arun.__name__ = node.__name__
    return RunnableLambda(run, afunc=arun, name=node.__name__)
