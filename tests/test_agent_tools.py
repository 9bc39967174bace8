"""The seeds' other agent tools: forget, list_memories, learn_procedure, record_episode (workflows.graph.tools)."""

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from test_langgraph_api import ToolCallingFake

from memory.exceptions import InvalidMemoryArgument
from memory.hints import CLOSE_TAG, OPEN_TAG
from memory.models import Episode, Fact, Procedure
from workflows import langgraph as engram
from workflows.exceptions import InvalidDefinition
from workflows.graph.agent import build_agent_graph
from workflows.language.definition import validate_definition

ALL = ("recall", "remember", "forget", "list_memories", "learn_procedure", "record_episode")
pytestmark = pytest.mark.django_db(transaction=True)  # LangGraph's ToolNode runs tools in worker threads


def run_agent(tools, *calls):
    """Run an agent whose fake model makes these tool calls, one per turn; the tool messages' contents."""
    turns = [
        AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": str(i)}])
        for i, (name, args) in enumerate(calls)
    ]
    model = ToolCallingFake(messages=iter([*turns, AIMessage(content="done")]))
    out = create_agent(model, tools).invoke({"messages": [("user", "go")]})
    return [(m.content, m.status) for m in out["messages"] if m.type == "tool"]


def test_an_agent_records_learns_lists_and_forgets_only_what_its_user_can_see(service, user_factory):
    ada, bob = user_factory("ada"), user_factory("bob")
    drink = service.set_fact("drink", "green tea", scope="user", user_id=ada.pk).fact
    bobs = service.set_fact("drink", "black coffee", scope="user", user_id=bob.pk).fact
    service.record_episode(
        started_at=drink.created_at, user_id=bob.pk, agent_id="bot", summary="Bob's secret", success=True
    )
    replies = run_agent(
        engram.memory_tools(agent_id="bot", user_id=ada.pk, names=ALL),
        ("record_episode", {"content": "Deployed v2 to staging; rolled back", "category": "Deploy Runs"}),
        ("learn_procedure", {"content": "Always confirm before deleting files", "category": "safety"}),
        ("list_memories", {}),
        ("forget", {"id": f"fact:{bobs.pk}"}),  # Bob's: refused, as if it did not exist
        ("forget", {"id": "fact:999999"}),
        ("forget", {"id": f"fact:{drink.pk}"}),
    )
    episode = Episode.objects.get(summary__startswith="Deployed")
    assert (episode.user_id, episode.agent_id, episode.trigger_type) == (ada.pk, "bot", "deploy_runs")
    assert replies[0] == (f"Recorded episode:{episode.pk} in deploy_runs.", "success")
    procedure = Procedure.objects.get(agent_id="bot")
    assert procedure.name == "safety/Always confirm before deleting files" and not procedure.is_active
    assert "stored inactive" in replies[1][0]

    listing = replies[2][0]
    assert listing.startswith(OPEN_TAG) and listing.endswith(CLOSE_TAG)  # read back as hints, not instructions
    assert f"[fact:{drink.pk} " in listing and "green tea" in listing
    assert f"[episode:{episode.pk} deploy_runs]" in listing
    assert "black coffee" not in listing and "Bob's secret" not in listing
    assert "[procedure:" not in listing  # an inactive procedure is not in use

    refused_other, refused_missing = replies[3], replies[4]
    assert refused_other[1] == refused_missing[1] == "error"
    assert refused_other[0].replace(str(bobs.pk), "N") == refused_missing[0].replace("999999", "N")
    assert replies[5] == (f"Forgot fact:{drink.pk}.", "success")
    assert list(Fact.objects.values_list("pk", flat=True)) == [bobs.pk]


def test_list_memories_filters_by_type_and_category(service, user_factory):
    ada = user_factory("ada")
    service.set_fact("editor", "vim", scope="user", user_id=ada.pk, fact_type="user_preference")
    service.set_fact("capital", "Paris", scope="user", user_id=ada.pk, fact_type="world_knowledge")
    tools = engram.memory_tools(
        agent_id="bot", user_id=ada.pk, names=ALL, configs={"learn_procedure": {"activate": True}}
    )
    replies = run_agent(
        tools,
        ("learn_procedure", {"content": "Use snake_case for Python", "category": "style"}),
        ("list_memories", {"memory_type": "facts", "category": "user_preference"}),
        ("list_memories", {"memory_type": "procedures", "category": "style"}),
        ("list_memories", {"memory_type": "facts", "category": "hobbies"}),
    )
    assert "(active)" in replies[0][0]
    assert "editor = vim" in replies[1][0] and "Paris" not in replies[1][0]
    assert "[procedure:" in replies[2][0] and "snake_case" in replies[2][0]
    assert replies[3][1] == "error" and "category" in replies[3][0]


@pytest.mark.parametrize(
    "call, field",
    [
        (("forget", {"id": "12"}), "id"),
        (("forget", {"id": "user:1"}), "id"),
        (("list_memories", {"memory_type": "everything"}), "memory_type"),
        (("list_memories", {"limit": 500}), "limit"),
        (("record_episode", {"content": "   "}), "content"),
        (("record_episode", {"content": "x", "category": "!!!"}), "category"),
        (("learn_procedure", {"content": ""}), "content"),
    ],
)
def test_bad_tool_input_names_the_field_and_writes_nothing(service, user_factory, call, field):
    ada = user_factory("ada")
    [(reply, status)] = run_agent(engram.memory_tools(agent_id="bot", user_id=ada.pk, names=ALL), call)
    assert status == "error" and field in reply
    assert not (Fact.objects.exists() or Episode.objects.exists() or Procedure.objects.exists())


def test_agent_nodes_enable_the_tools_by_name(db):
    tools = {name: None for name in ALL} | {"learn_procedure": {"activate": True}, "list_memories": {"limit": 5}}
    validate_definition(
        {
            "nodes": [{"id": "agent", "type": "agent", "config": {"tools": tools}}],
            "edges": [{"source": "START", "target": "agent"}, {"source": "agent", "target": "END"}],
        }
    )
    with pytest.raises(InvalidDefinition, match="activate"):
        validate_definition(
            {
                "nodes": [
                    {"id": "agent", "type": "agent", "config": {"tools": {"learn_procedure": {"activate": "yes"}}}}
                ],
                "edges": [{"source": "START", "target": "agent"}, {"source": "agent", "target": "END"}],
            }
        )
    graph = build_agent_graph({"tools": tools}, ToolCallingFake(messages=iter([])))
    assert set(graph.nodes["tools"].bound.tools_by_name) == set(ALL)
    with pytest.raises(InvalidMemoryArgument) as caught:
        engram.memory_tools(agent_id="bot", names=["recall", "teleport"])
    assert caught.value.field == "names"
