"""The state a workflow run carries from node to node, and the value objects inside it."""

import operator
from dataclasses import dataclass, field
from typing import Annotated, Any

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages
from typing_extensions import (
    TypedDict,  # pydantic (the tools' runtime context) needs this one on 3.11
)


class UserInfo(TypedDict):
    """Who the run is for, as identify_user found them (following merges)."""

    id: int
    canonical_id: str
    display_name: str
    channel: str
    external_id: str
    is_new: bool


class FactToRemember(TypedDict, total=False):
    key: str
    value: Any
    fact_type: str
    scope: str


class RememberedFact(TypedDict, total=False):
    """What the remember node did with one fact: created, updated, confirmed, skipped, or failed."""

    key: str
    scope: str
    action: str
    error: str


class MemoryErrorReport(TypedDict):
    node: str
    operation: str
    error: str


class WorkflowState(TypedDict, total=False):
    # Set by the runtime.
    trigger: dict  # {"type": "telegram" | "chat" | "webhook" | "manual", "payload": {...}}
    workflow: dict  # {"id", "slug"}
    run_started_at: str  # ISO 8601
    messages: Annotated[list[AnyMessage], add_messages]
    # identify_user
    user: UserInfo | None
    # True when the trigger named a person who could not be identified: the run fails closed, and
    # nothing derived from their words is stored at a wider scope (see the remember node and tool).
    identity_failed: bool
    conversation_id: str
    user_context: dict
    # recall
    memories: dict
    memory_prompt: str
    # What recall found, for the builder: {"query", "hits": [{"kind", "id", "text", "score"}], "scopes": {key: scope}}
    recall_trace: dict
    # agent
    reply: str
    thread_id: str
    actions: Annotated[list[dict], operator.add]
    facts_to_remember: Annotated[list[FactToRemember], operator.add]
    # The conversation's running summary (its turns past history_limit), when this turn changed it, and
    # the one it replaced: the remember node stores it on the turn's episode, taken off the earlier one.
    conversation_summary: str
    replaced_summary: str
    # remember
    remembered: list[RememberedFact]
    episode_id: int | None
    # Every row remember wrote: [{"kind": "fact" | "episode", "action", "id", "key", ...}]
    memory_writes: list[dict]
    # Any node: memory operations that failed (logged too). A run with any is not a success.
    memory_errors: Annotated[list[MemoryErrorReport], operator.add]


def last_human_text(state) -> str:
    """The text of the latest human message in the state ('' if none)."""
    for message in reversed(state.get("messages") or []):
        if message.type == "human":
            return message.text if isinstance(message.content, (str, list)) else str(message.content)
    return ""


@dataclass
class AgentContext:
    """The run-time context of one agent turn (LangGraph `context`, not checkpointed).

    Tools read who they act for from here; the prompt and the offline responder read the memory.
    """

    agent_id: str
    user: UserInfo | None = None
    session_id: str = ""
    system_prompt: str = ""
    # The recalled-memory block (untrusted): sent as its own message, never in the system prompt.
    memory_prompt: str = ""
    memories: dict = field(default_factory=dict)
