"""Engram in a graph of the developer's own (workflows.langgraph): nodes, tools, tracked conversations."""

import operator
import re
from pathlib import Path
from typing import Annotated, TypedDict

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

from memory.exceptions import InvalidMemoryArgument
from memory.models import Episode, Fact
from workflows import langgraph as engram
from workflows.conversations.threads import list_checkpoints
from workflows.models import Thread

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guides" / "own-graph.md"


def readme_example():
    """The first Python block of the guide "Use Engram in your own graph" (before its first subsection)."""
    section = GUIDE.read_text().split("# Use Engram in your own graph", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_runs_as_written_and_remembers(db, django_capture_on_commit_callbacks):
    code = readme_example()
    assert len(code.strip().splitlines()) <= 30
    namespace = {}
    exec(compile(code, "own-graph.md", "exec"), namespace)  # noqa: S102  (the documented example, verbatim)
    ada = namespace["ada"]
    fact = Fact.objects.get(key="drink")
    assert (fact.value, fact.scope, fact.user_id) == ("tea", "user", ada.pk)
    # The turn's episode holds the graph's reply (its last AI message) and counts as a success.
    episode = Episode.objects.get(user=ada)
    assert episode.conversation == [
        {"role": "user", "content": "I drink tea"},
        {"role": "assistant", "content": "Noted."},
    ]
    assert (episode.final_output, episode.success, episode.error) == ({"reply": "Noted."}, True, "")
    thread = Thread.objects.get(user=ada)
    first = thread.checkpoint_count
    assert (thread.graph, thread.workflow_id) == ("helper", None)
    assert first >= 1 and first == len(list_checkpoints(thread.thread_id))
    # A second turn recalls what the first stored, continues the same thread, and counts its checkpoint.
    app = namespace["app"]
    with engram.conversation("helper", user_id=ada.pk) as config:
        state = app.invoke(
            {
                "trigger": {"type": "chat", "payload": {"user_id": "42", "message": "what do I drink?"}},
                "messages": [("user", "what do I drink?")],
            },
            config,
        )
    assert [f["value"] for f in state["notes"]["facts"]] == ["tea"]
    assert state["memory_errors"] == [] or not state.get("memory_errors")
    thread.refresh_from_db()
    assert thread.checkpoint_count > first and thread.checkpoint_count == len(list_checkpoints(thread.thread_id))
    # Forgetting the person takes the conversation with them.
    from memory.service import MemoryService

    with django_capture_on_commit_callbacks(execute=True):
        MemoryService().delete_users([ada.pk], cascade=True)
    assert not Thread.objects.exists() and list_checkpoints(thread.thread_id) == []


class Renamed(TypedDict, total=False):
    incoming: dict
    messages: Annotated[list, add_messages]
    who: dict
    recalled: dict
    errors: Annotated[list, operator.add]


def test_nodes_read_and_write_the_callers_own_keys(service, user_factory):
    ada = user_factory("ada")
    service.set_fact("city", "Lisbon", scope="user", user_id=ada.pk)
    graph = StateGraph(Renamed)
    graph.add_node(
        "identify",
        engram.identify_user(
            keys={"trigger": "incoming", "user": "who", "memory_errors": "errors", "user_context": None}
        ),
    )
    graph.add_node(
        "recall", engram.recall(agent_id="bot", keys={"user": "who", "memories": "recalled", "memory_errors": "errors"})
    )
    graph.add_edge(START, "identify")
    graph.add_edge("identify", "recall")
    out = graph.compile().invoke(
        {
            "incoming": {"type": "chat", "payload": {"user_name": "ada", "channel": "test", "message": "my city?"}},
            "messages": [("user", "which city do I live in?")],
        }
    )
    assert out["who"]["id"] == ada.pk
    assert [f["value"] for f in out["recalled"]["facts"]] == ["Lisbon"]
    assert out["errors"] == []


def test_a_failed_identification_is_reported_under_the_callers_key(db):
    graph = StateGraph(Renamed)
    graph.add_node(
        "identify", engram.identify_user(keys={"trigger": "incoming", "user": "who", "memory_errors": "errors"})
    )
    graph.add_edge(START, "identify")
    out = graph.compile().invoke({"incoming": {"type": "carrier-pigeon", "payload": {}}})
    assert out["who"] is None
    assert out["errors"][0]["operation"] == "identify_user" and "trigger.type" in out["errors"][0]["error"]


def test_unknown_state_keys_and_a_missing_agent_are_refused():
    with pytest.raises(InvalidMemoryArgument) as caught:
        engram.recall(agent_id="bot", keys={"memorys": "x"})
    assert caught.value.field == "keys"
    with pytest.raises(InvalidMemoryArgument) as caught:
        engram.remember(agent_id="")
    assert caught.value.field == "agent_id"


class ToolCallingFake(GenericFakeChatModel):
    def bind_tools(self, tools, **kwargs):
        return self


@pytest.mark.django_db(transaction=True)  # LangGraph's ToolNode runs tools in worker threads
def test_memory_tools_act_for_the_bound_user_in_a_prebuilt_agent(service, user_factory):
    ada, bob = user_factory("ada"), user_factory("bob")
    service.set_fact("pet", "a parrot", scope="user", user_id=bob.pk)
    model = ToolCallingFake(
        messages=iter(
            [
                AIMessage(
                    content="",
                    tool_calls=[{"name": "remember", "args": {"key": "pet", "value": "a cat"}, "id": "1"}],
                ),
                AIMessage(content="", tool_calls=[{"name": "recall", "args": {"key": "pet"}, "id": "2"}]),
                AIMessage(content="You have a cat."),
            ]
        )
    )
    agent = create_agent(model, engram.memory_tools(agent_id="bot", user_id=ada.pk))
    out = agent.invoke({"messages": [("user", "I have a cat. What pet do I have?")]})
    tool_replies = [m.content for m in out["messages"] if m.type == "tool"]
    assert tool_replies[0].startswith("Remembered pet = a cat for this user")
    assert tool_replies[1].startswith("pet = a cat (user")  # Ada's, never Bob's parrot
    assert Fact.objects.get(key="pet", user=ada).value == "a cat"
    assert Fact.objects.get(key="pet", user=bob).value == "a parrot"


def test_a_graphs_threads_obey_the_thread_limit_and_show_in_the_api(api, service, user_factory, settings):
    settings.WORKFLOWS = {**settings.WORKFLOWS, "MAX_THREADS_PER_WORKFLOW": 2}
    graph = StateGraph(Renamed)
    graph.add_node("say", lambda state: {"messages": [("ai", "hi")]})
    graph.add_edge(START, "say")
    app = graph.compile(checkpointer=engram.get_checkpointer())
    users = [user_factory(name) for name in ("ann", "bea", "cy")]
    for user in users:
        with engram.conversation("greeter", user_id=user.pk, channel="chat") as config:
            app.invoke({"messages": [("user", "hello")]}, config)
    kept = set(Thread.objects.values_list("user_id", flat=True))
    assert kept == {users[1].pk, users[2].pk}  # the least recently active thread went
    body = api.get("/api/v1/checkpoints/", {"graph": "greeter"}).json()
    assert {row["graph"] for row in body["results"]} == {"greeter"} and body["count"] == 2
    assert all(row["workflow"] is None for row in body["results"])
