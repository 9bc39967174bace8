"""Session memory: the conversation (so the session owner) is known before `recall` runs.

The standard pipeline identify_user -> recall -> agent -> remember with `remember` storing at
session scope, in Engram's workflows (run_workflow, the REST run endpoint, the Telegram webhook)
and in a graph built in code from the public nodes; a session fact is recalled in its own
conversation and in no other.
"""

import copy
from typing import Annotated, TypedDict

import httpx
import pytest
from conftest import WEBHOOK_SECRET
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

from memory.models import Fact, MemoryUser
from tests.workflow_helpers import talk
from workflows import langgraph as engram
from workflows.channels.fake_telegram import telegram_update
from workflows.demo import DEMO_DEFINITION
from workflows.models import Thread, Workflow


def session_workflow(*, conversation_memory=True, slug="sessions"):
    """The demo's four nodes, `remember` storing at session scope."""
    definition = copy.deepcopy(DEMO_DEFINITION)
    for node in definition["nodes"]:
        if node["type"] == "remember":
            node["config"] = {"scope": "session"}
        if node["type"] == "agent":
            node["config"]["conversation_memory"] = conversation_memory
    return Workflow.objects.create(slug=slug, name=slug, definition=definition, is_active=True)


@pytest.mark.parametrize("conversation_memory", [True, False], ids=["with-history", "without-history"])
def test_a_session_fact_is_recalled_in_the_next_turn_of_the_conversation(db, conversation_memory):
    workflow = session_workflow(conversation_memory=conversation_memory)
    first = talk(workflow, "zed", "my name is Zed")
    assert first.memory_errors == []
    assert [(r["key"], r["scope"], r["action"]) for r in first.remembered] == [("name", "session", "created")]
    session = f"{first.user['id']}:direct:{workflow.pk}"
    assert first.thread_id == session
    fact = Fact.objects.get(key="name")
    assert (fact.scope, fact.session_id, fact.user_id, fact.value) == ("session", session, None, "Zed")

    second = talk(workflow, "zed", "what is my name?")
    assert second.thread_id == session and second.memory_errors == []
    assert [(f["key"], f["value"], f["scope"]) for f in second.state["memories"]["facts"]] == [
        ("name", "Zed", "session")
    ]
    assert "Your name is Zed" in second.reply
    # Without conversation history the session is the same, and no checkpoint thread is kept.
    assert Thread.objects.filter(thread_id=session).exists() is conversation_memory


def test_another_conversation_of_the_same_person_does_not_see_the_session_fact(db):
    workflow = session_workflow()
    talk(workflow, "zed", "my name is Zed")
    elsewhere = talk(workflow, "zed", "what is my name?", conversation_id="team-chat")
    assert elsewhere.user["id"] == MemoryUser.objects.get().pk  # the same person
    assert elsewhere.thread_id.split(":")[1] == "team-chat"
    assert elsewhere.state["memories"]["facts"] == []
    assert "Zed" not in elsewhere.reply
    # Nor does another workflow's conversation with them, which is a session of its own.
    other = session_workflow(slug="other")
    assert "Zed" not in talk(other, "zed", "what is my name?").reply
    # The first conversation still does.
    assert "Your name is Zed" in talk(workflow, "zed", "what is my name?").reply


def test_the_rest_run_endpoint_and_the_command_share_the_session(admin_client, db):
    from django.core.management import call_command

    workflow = session_workflow()
    response = admin_client.post(
        f"/api/v1/workflows/{workflow.slug}/run/",
        {"user_id": "zed", "message": "my name is Zed"},
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    assert response.json()["remembered"][0]["scope"] == "session"
    # The same person on the same channel, through `manage.py run_workflow`: the same conversation.
    from io import StringIO

    out = StringIO()
    call_command("run_workflow", workflow.slug, user="chat:zed", message="what is my name?", stdout=out)
    assert "Your name is Zed" in out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_a_telegram_conversation_recalls_its_session_and_a_group_does_not(live_server, fake_bot):
    workflow = session_workflow()
    url = f"{live_server.url}/telegram/{workflow.slug}/webhook/"
    headers = {"X-Telegram-Bot-Api-Secret-Token": WEBHOOK_SECRET}
    with httpx.Client(timeout=30) as client:
        assert client.post(url, json=telegram_update(1, 42, "my name is Zed"), headers=headers).status_code == 200
        assert client.post(url, json=telegram_update(2, 42, "what is my name?"), headers=headers).status_code == 200
        group = telegram_update(3, 42, "what is my name?", chat_id=-1001, chat_type="supergroup")
        assert client.post(url, json=group, headers=headers).status_code == 200
    direct = [m["text"] for m in fake_bot.sent_messages(42)]
    assert len(direct) == 2 and "Your name is Zed" in direct[1]
    (in_group,) = [m["text"] for m in fake_bot.sent_messages(-1001)]
    assert "Zed" not in in_group


class OwnState(TypedDict, total=False):
    trigger: dict
    messages: Annotated[list, add_messages]
    user: dict
    memories: dict
    facts_to_remember: list
    remembered: list


def own_graph(checkpointer=True):
    """A graph of the developer's own: the public nodes around a reply node of theirs."""

    def reply(state):
        known = {f["key"]: f["value"] for f in state["memories"]["facts"]}
        text = state["messages"][-1].content
        if text.startswith("my name is "):
            return {"messages": [("ai", "Noted.")], "facts_to_remember": [{"key": "name", "value": text[11:]}]}
        return {"messages": [("ai", f"You are {known.get('name', 'unknown to me')}.")]}

    graph = StateGraph(OwnState)
    graph.add_sequence(
        [
            ("identify_user", engram.identify_user()),
            ("recall", engram.recall(agent_id="helper")),
            ("reply", reply),
            ("remember", engram.remember(agent_id="helper", scope="session")),
        ]
    )
    graph.add_edge(START, "identify_user")
    return graph.compile(checkpointer=engram.get_checkpointer() if checkpointer else None)


def own_turn(app, user, text, conversation_id="direct"):
    with engram.conversation("helper", user_id=user.pk, conversation_id=conversation_id) as config:
        state = app.invoke(
            {
                "trigger": {"type": "chat", "payload": {"user_id": "42", "message": text}},
                "messages": [("user", text)],
                "facts_to_remember": [],
            },
            config,
        )
    return state, config["configurable"]["thread_id"]


def test_a_graph_of_ones_own_keeps_session_facts_to_its_conversation(service, db):
    app = own_graph()
    zed, _ = service.get_or_create_user("chat", "42", display_name="Zed")
    state, thread_id = own_turn(app, zed, "my name is Zed")
    assert state["remembered"] == [{"key": "name", "scope": "session", "action": "created"}]
    assert Fact.objects.get(key="name").session_id == thread_id == f"{zed.pk}:direct:graph:helper"
    state, _ = own_turn(app, zed, "who am I?")
    assert state["messages"][-1].content == "You are Zed."
    state, _ = own_turn(app, zed, "who am I?", conversation_id="elsewhere")
    assert state["messages"][-1].content == "You are unknown to me."


@pytest.mark.django_db(transaction=True)  # ainvoke runs the nodes on worker threads, with their own connections
def test_the_public_nodes_find_the_session_under_ainvoke(service):
    import asyncio

    app = own_graph(checkpointer=False)  # the shared SqliteSaver is sync-only; the thread is in the config
    zed, _ = service.get_or_create_user("chat", "42", display_name="Zed")
    thread_id = f"{zed.pk}:direct:graph:helper"
    service.set_fact("name", "Zed", scope="session", session_id=thread_id)
    turn = {
        "trigger": {"type": "chat", "payload": {"user_id": "42", "message": "who?"}},
        "messages": [("user", "who?")],
    }
    state = asyncio.run(app.ainvoke(turn, {"configurable": {"thread_id": thread_id}}))
    assert state["messages"][-1].content == "You are Zed."
