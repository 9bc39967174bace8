"""The seeds' tool signatures: remember(key, value, fact_type, tags, importance) and recall(query, top_k,
memory_types) within the node config's limits, and the agent node's per-type switches."""

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from test_agent_tools import run_agent
from test_langgraph_api import ToolCallingFake

from memory.exceptions import InvalidMemoryArgument
from memory.models import Episode, Fact, Procedure
from workflows import langgraph as engram
from workflows.graph.agent import build_agent_graph
from workflows.graph.tools import tools_for
from workflows.language.state import AgentContext

pytestmark = pytest.mark.django_db(transaction=True)  # LangGraph's ToolNode runs tools in worker threads


def test_remember_stores_tags_and_importance_and_a_rewrite_replaces_them(service, user_factory):
    ada = user_factory("ada")
    tools = engram.memory_tools(agent_id="bot", user_id=ada.pk)
    replies = run_agent(
        tools,
        (
            "remember",
            {"key": "db", "value": "PostgreSQL", "tags": ["Architecture", "database", "database"], "importance": 0.95},
        ),
        ("remember", {"key": "editor", "value": "vim"}),
        ("remember", {"key": "db", "value": "PostgreSQL 17", "tags": ["infra"]}),
    )
    assert [status for _, status in replies] == ["success"] * 3
    assert "tags architecture, database" in replies[0][0]
    editor = Fact.objects.get(key="editor")
    assert editor.tags == [] and editor.confidence == pytest.approx(0.8)  # MEMORY["DEFAULT_CONFIDENCE"]
    db = Fact.objects.get(key="db")
    assert (db.value, db.tags, db.user_id) == ("PostgreSQL 17", ["infra"], ada.pk)
    # Without tags a write keeps the stored ones; the same value confirms.
    service.set_fact("db", "PostgreSQL 17", scope="user", user_id=ada.pk)
    assert Fact.objects.get(key="db").tags == ["infra"]


def test_importance_ranks_recall_as_a_facts_confidence(service, user_factory):
    ada = user_factory("ada")
    run_agent(
        engram.memory_tools(agent_id="bot", user_id=ada.pk),
        ("remember", {"key": "deploy day", "value": "friday deploy freeze", "importance": 0.2}),
        ("remember", {"key": "deploy window", "value": "deploy on tuesday mornings", "importance": 1.0}),
    )
    assert dict(Fact.objects.values_list("key", "confidence")) == {"deploy day": 0.2, "deploy window": 1.0}
    # min_confidence of the recall tool (0.5) leaves the unimportant fact out.
    [(reply, _)] = run_agent(engram.memory_tools(agent_id="bot", user_id=ada.pk), ("recall", {"query": "deploy"}))
    assert "tuesday" in reply and "friday" not in reply


@pytest.mark.parametrize(
    "args, field",
    [
        ({"key": "k", "value": "v", "importance": 1.5}, "importance"),
        ({"key": "k", "value": "v", "importance": "high"}, "importance"),
        ({"key": "k", "value": "v", "tags": ["ok", "!!!"]}, "tags"),
        ({"key": "k", "value": "v", "tags": [f"t{i}" for i in range(21)]}, "tags"),
        ({"key": "k", "value": "v", "tags": ["x" * 51]}, "tags"),
    ],
)
def test_bad_remember_arguments_name_the_field_and_store_nothing(service, user_factory, args, field):
    ada = user_factory("ada")
    [(reply, status)] = run_agent(engram.memory_tools(agent_id="bot", user_id=ada.pk), ("remember", args))
    assert status == "error" and f"{field}:" in reply
    assert not Fact.objects.exists()


def test_service_refuses_tags_that_are_not_a_list(service):
    with pytest.raises(InvalidMemoryArgument) as caught:
        service.set_fact("k", "v", tags="database")
    assert caught.value.field == "tags" and not Fact.objects.exists()


def _seed(service, ada):
    for n in range(6):
        service.set_fact(f"coffee {n}", f"coffee fact {n}", scope="user", user_id=ada.pk)
    service.record_episode(
        started_at=Fact.objects.first().created_at,
        agent_id="bot",
        user_id=ada.pk,
        summary="talked coffee",
        success=True,
    )
    service.save_procedure("coffee/brew", agent_id="bot", description="brew coffee slowly", trigger_conditions={})


def test_recall_takes_top_k_and_memory_types_within_the_configured_limits(service, user_factory):
    ada = user_factory("ada")
    _seed(service, ada)
    tools = engram.memory_tools(
        agent_id="bot",
        user_id=ada.pk,
        recall_config={"memory_types": ["facts", "episodes"], "limit": 5, "max_top_k": 3},
    )
    replies = run_agent(
        tools,
        ("recall", {"query": "coffee"}),  # the default top_k: limit, cut to max_top_k
        ("recall", {"query": "coffee", "top_k": 2, "memory_types": ["semantic"]}),
        ("recall", {"query": "coffee", "memory_types": ["episodes"]}),
        ("recall", {"query": "coffee", "top_k": 4}),
        ("recall", {"query": "coffee", "memory_types": ["procedures"]}),
        ("recall", {"query": "coffee", "memory_types": ["dreams"]}),
    )
    first, two_facts, episodes, too_many, not_allowed, unknown = replies
    assert first[0].count("coffee fact") == 3 and "past conversation" in first[0]
    assert two_facts[0].count("coffee fact") == 2 and "past conversation" not in two_facts[0]
    assert "past conversation" in episodes[0] and "coffee fact" not in episodes[0]
    assert too_many[1] == "error" and "top_k: must be 1 to 3" in too_many[0]
    assert not_allowed[1] == "error" and "memory_types:" in not_allowed[0] and "facts, episodes" in not_allowed[0]
    assert unknown[1] == "error" and "memory_types:" in unknown[0]


def test_a_type_switched_off_loses_its_tools_and_recall_leaves_it_out(service, user_factory):
    ada = user_factory("ada")
    _seed(service, ada)
    tools = {n: None for n in ("recall", "remember", "list_memories", "record_episode", "learn_procedure", "forget")}
    tools["recall"] = {"memory_type": "all"}
    graph = build_agent_graph(
        {"tools": tools, "memory_types": {"episodes": False, "procedures": False}}, ToolCallingFake(messages=iter([]))
    )
    offered = graph.nodes["tools"].bound.tools_by_name
    assert set(offered) == {"recall", "remember", "list_memories", "forget"}
    bound = AgentContext(agent_id="bot", user={"id": ada.pk})
    switched = tools_for(tools, {"episodes": False, "procedures": False}, bound=bound)
    episode = Episode.objects.get()
    model = ToolCallingFake(
        messages=iter(
            [
                AIMessage(content="", tool_calls=[{"name": "recall", "args": {"query": "coffee"}, "id": "1"}]),
                AIMessage(
                    content="",
                    tool_calls=[
                        {"name": "recall", "args": {"query": "coffee", "memory_types": ["episodes"]}, "id": "2"}
                    ],
                ),
                AIMessage(content="", tool_calls=[{"name": "list_memories", "args": {}, "id": "3"}]),
                AIMessage(
                    content="", tool_calls=[{"name": "forget", "args": {"id": f"episode:{episode.pk}"}, "id": "4"}]
                ),
                AIMessage(content="done"),
            ]
        )
    )
    out = create_agent(model, switched).invoke({"messages": [("user", "go")]})
    replies = [(m.content, m.status) for m in out["messages"] if m.type == "tool"]
    assert "coffee fact" in replies[0][0] and "past conversation" not in replies[0][0]
    assert "procedure" not in replies[0][0]
    assert replies[1][1] == "error" and "memory_types:" in replies[1][0]
    assert "[fact:" in replies[2][0] and "[episode:" not in replies[2][0] and "[procedure:" not in replies[2][0]
    assert replies[3][1] == "error" and "switched off" in replies[3][0]
    assert Episode.objects.exists() and Procedure.objects.exists()
