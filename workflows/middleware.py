"""Engram's memory for an agent of your own: a LangChain agent middleware for `create_agent`.

    from langchain.agents import create_agent
    from workflows.langgraph import EngramMemoryMiddleware

    agent = create_agent(model, tools, middleware=[EngramMemoryMiddleware(agent_id="helper")])
    agent.invoke({"messages": [("user", "I drink tea")]}, context={"user_id": ada.pk})

Whom a turn is for is the memory user id under `user_id` in the run's context (a dict or an object
with that attribute) or, failing that, in `config["configurable"]` (as `langgraph dev` passes it).
Before each model call, what the agent remembers for that person and the last human message is
recalled and sent as a message of its own just before that human message, inside the
`<recalled-memory>` block marked UNTRUSTED HINTS: the same block, in the same place, as Engram's own
agents get, and never added to the agent's state, so never checkpointed. After the agent, the turn
(the human message, the reply, the tool calls) is recorded as one episode of the agent with that
person, under the thread id as session when there is one.

A memory failure (the database) is logged and added to `memory_errors` in the agent's state, and the
turn goes on without memory; a turn with one is recorded as unsuccessful. A user id that is not an id,
or names no memory user, is refused before anything runs (`InvalidMemoryArgument` / `MemoryNotFound`,
naming `user_id`). Without a user id, only the agent's and global memories are recalled, and no
episode is recorded (the words are nobody's we know), which `memory_errors` says.
"""

import logging
import operator
from datetime import datetime
from typing import Annotated, Any, NotRequired

from django.db import DatabaseError
from django.utils import timezone
from langchain.agents import AgentState
from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware.types import ExtendedModelResponse, PrivateStateAttr
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.config import get_config
from langgraph.types import Command

from memory.asynchronous import off_the_loop
from memory.exceptions import MemoryServiceError
from memory.rules.validation import check_user_id, clean_text, storable
from memory.service import MemoryService

from .graph.agent import episode_actions, since_last_human, with_memory
from .graph.memory_access import RecallOptions, RecallScope, add_pins, recall_for, render_memory_prompt
from .graph.offline import OfflineResponder

logger = logging.getLogger("engram.workflows")

MEMORY_FAILURES = (MemoryServiceError, DatabaseError)


class EngramMemoryState(AgentState):
    # Memory operations that failed, as Engram's workflows report them (node, operation, error).
    memory_errors: NotRequired[Annotated[list[dict], operator.add]]
    # The episode this turn was recorded as (None: not recorded).
    episode_id: NotRequired[int | None]
    # This turn's person, session, start and errors so far: set before the agent, read after it.
    engram_turn: NotRequired[Annotated[dict[str, Any], PrivateStateAttr]]


class EngramMemoryMiddleware(AgentMiddleware):
    """Recall before each model call, record the episode after the agent (see the module docstring)."""

    state_schema = EngramMemoryState

    def __init__(self, *, agent_id, memory_types=("all",), limit=10, min_confidence=0.5, record_episode=True):
        super().__init__()
        self.agent_id = clean_text("agent_id", agent_id, max_length=128)
        self.options = RecallOptions.from_config(
            {"memory_types": list(memory_types), "limit": limit, "min_confidence": min_confidence}
        )
        self.record = record_episode

    @property
    def name(self):
        return "EngramMemoryMiddleware"

    # ------------------------------------------------------------------ before the agent

    def before_agent(self, state, runtime):
        return self._begin(state, _user_id_of(runtime), _session_of())

    async def abefore_agent(self, state, runtime):
        return await off_the_loop(self._begin)(state, _user_id_of(runtime), _session_of())

    def _begin(self, state, user_id, session_id):
        turn = {
            "started_at": timezone.now().isoformat(),
            "user_id": None,
            "session_id": session_id,
            "errors_before": len(state.get("memory_errors") or []),
        }
        update = {"engram_turn": turn, "episode_id": None}
        if user_id is None:
            update["memory_errors"] = [
                self._failure(
                    "identify",
                    "user_id: not in the run's context or config['configurable']; only the agent's and global "
                    "memories are recalled, and no episode is recorded",
                    log=logger.warning,
                )
            ]
            return update
        # A malformed or unknown id is the caller's mistake: refused here, before the model runs.
        check_user_id("user_id", user_id, required=True)
        try:
            turn["user_id"] = MemoryService().resolve_user(user_id).pk  # the survivor of a merge
        except DatabaseError as exc:
            update["memory_errors"] = [self._failure("identify", exc)]
        return update

    # ------------------------------------------------------------------ each model call

    def wrap_model_call(self, request, handler):
        changes, errors = self._recall(request)
        return _with_errors(handler(request.override(**changes)), errors)

    async def awrap_model_call(self, request, handler):
        changes, errors = await off_the_loop(self._recall)(request)
        return _with_errors(await handler(request.override(**changes)), errors)

    def _recall(self, request):
        """The request's changes (the memory block; the offline responder given the memories) and failures."""
        turn = request.state.get("engram_turn") or {}
        query = _last_human_text(request.messages)
        scope = RecallScope(agent_id=self.agent_id, user_id=turn.get("user_id"), session_id=turn.get("session_id", ""))
        try:
            recalled = add_pins(recall_for(query, scope, self.options), scope)  # pinned memory reaches every prompt
        except MEMORY_FAILURES as exc:
            return {}, [self._failure("recall", exc)]
        changes = {"messages": with_memory(request.messages, render_memory_prompt(recalled))}
        if isinstance(request.model, OfflineResponder):
            # The stand-in model answers from the memories it is given, not from the prompt.
            changes["model"] = OfflineResponder(memories=recalled.as_dict())
        return changes, []

    # ------------------------------------------------------------------ after the agent

    def after_agent(self, state, runtime):
        return self._finish(state)

    async def aafter_agent(self, state, runtime):
        return await off_the_loop(self._finish)(state)

    def _finish(self, state):
        turn = state.get("engram_turn") or {}
        if not self.record or turn.get("user_id") is None:
            return None
        messages = state.get("messages") or []
        produced = since_last_human(messages)
        reply = next((m.text for m in reversed(produced) if isinstance(m, AIMessage) and m.text), "")
        errors = (state.get("memory_errors") or [])[turn.get("errors_before", 0) :]
        started = turn.get("started_at")
        try:
            episode = MemoryService().record_episode(
                started_at=datetime.fromisoformat(started) if started else timezone.now(),
                agent_id=self.agent_id,
                user_id=turn["user_id"],
                session_id=turn.get("session_id", ""),
                trigger_type="agent",
                conversation=storable(
                    [{"role": "user", "content": _last_human_text(messages)}]
                    + ([{"role": "assistant", "content": reply}] if reply else [])
                ),
                actions=storable(episode_actions(produced)),
                final_output=storable({"reply": reply}) if reply else None,
                success=bool(reply) and not errors,
                error=storable("; ".join(str(e.get("error", "")) for e in errors)),
            )
        except MEMORY_FAILURES as exc:
            return {"episode_id": None, "memory_errors": [self._failure("record_episode", exc)]}
        return {"episode_id": episode.pk}

    def _failure(self, operation, error, log=logger.error):
        log("agent middleware %s: %s failed: %s", self.agent_id, operation, error)
        return {"node": self.name, "operation": operation, "error": str(error)}


def _user_id_of(runtime):
    """The memory user id under `user_id` in the run's context, else in config["configurable"]."""
    context = getattr(runtime, "context", None)
    found = context.get("user_id") if isinstance(context, dict) else getattr(context, "user_id", None)
    if found is None:
        found = (_config().get("configurable") or {}).get("user_id")
    return found


def _session_of():
    return str((_config().get("configurable") or {}).get("thread_id") or "")[:128]


def _config():
    try:
        return get_config()
    except RuntimeError:  # outside a runnable context: no config to read
        return {}


def _last_human_text(messages):
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            return message.text
    return ""


def _with_errors(response, errors):
    """The model's response, with this call's memory failures added to the agent's state."""
    if not errors:
        return response
    return ExtendedModelResponse(model_response=response, command=Command(update={"memory_errors": errors}))
