"""Fail closed: a run whose user could not be identified stores nothing of their words where others see it.

The attack: identification fails (here by a real unique-constraint error in the database), the run
goes on without a user, and the agent's `remember` tool used to store the user's words as the agent's
own (`agent:<id>`), which the agent then told every other user; the run's episode, stored without a
user, was recalled for other users too.
"""

import pytest
from django.utils import timezone
from langchain_core.messages import AIMessage
from test_workflows_agent import TOOLS_RUN_IN_WORKER_THREADS, ToolCallingFake, fake_model, make_workflow  # noqa: F401

from memory.models import ChannelIdentity, Episode, Fact
from workflows.graph.nodes import build_remember
from workflows.graph.runtime import run_workflow
from workflows.language.registry import BuildContext


def unidentifiable(service, name):
    """A chat user whose identification fails in the database: their canonical id is taken by a user
    whose identity row is gone, so creating them again breaks the canonical id's unique constraint."""
    user, _ = service.get_or_create_user("chat", name)
    ChannelIdentity.objects.filter(user=user).delete()
    return user


def remember_call(key, value):
    return AIMessage(
        "", tool_calls=[{"name": "remember", "args": {"key": key, "value": value}, "id": "r1", "type": "tool_call"}]
    )


@TOOLS_RUN_IN_WORKER_THREADS
def test_remember_tool_refuses_when_the_user_could_not_be_identified(service, fake_model):  # noqa: F811
    unidentifiable(service, "victim")
    fake_model([remember_call("door_code", "4711-victim"), AIMessage("Noted.")])
    workflow = make_workflow()
    episodes = Episode.objects.count()
    result = run_workflow(
        workflow, {"type": "chat", "payload": {"user_id": "victim", "message": "my door code is 4711-victim"}}
    )
    assert result.user is None and result.state["identity_failed"] is True
    assert not Fact.objects.filter(key="door_code").exists()  # not as the agent's, not anywhere
    [action] = result.state["actions"]  # what the tool told the model: an error, not "Remembered"
    assert action["tool"] == "remember" and action["status"] == "error" and "nobody is identified" in action["result"]
    assert Episode.objects.count() == episodes  # no ownerless episode with their words either
    assert {e["operation"] for e in result.memory_errors} >= {"identify_user", "remember"}


@TOOLS_RUN_IN_WORKER_THREADS
def test_agent_scope_without_a_user_is_an_explicit_choice(service, fake_model):  # noqa: F811
    fake_model([remember_call("office_hours", "9 to 5"), AIMessage("Noted.")])
    workflow = make_workflow(slug="opted-in", tools={"remember": {"agent_scope_without_user": True}})
    unidentifiable(service, "someone")
    run_workflow(workflow, {"type": "chat", "payload": {"user_id": "someone", "message": "we open 9 to 5"}})
    assert Fact.objects.get(key="office_hours").scope_key == "agent:opted-in"


CTX = BuildContext(workflow_id=1, workflow_slug="demo", node_id="remember")


@pytest.mark.django_db
@pytest.mark.parametrize("scope", ["agent", "global", "session", "user"])
def test_remember_node_stores_nothing_after_a_failed_identification(scope):
    remember = build_remember({}, CTX)
    state = {
        "user": None,
        "identity_failed": True,
        "thread_id": "t-1",
        "messages": [],
        "facts_to_remember": [{"key": "bank_pin", "value": "1234", "scope": scope}],
    }
    update = remember(state)
    assert update["episode_id"] is None
    assert (
        update["remembered"][0]["action"] == "failed" and "could not be identified" in update["remembered"][0]["error"]
    )
    assert update["memory_errors"]
    assert not Fact.objects.exists() and not Episode.objects.exists()


@pytest.mark.django_db
def test_remember_node_can_be_told_to_store_without_a_user():
    remember = build_remember({"store_without_user": True}, CTX)
    update = remember(
        {
            "user": None,
            "identity_failed": True,
            "messages": [],
            "facts_to_remember": [{"key": "opening", "value": "9", "scope": "agent"}],
        }
    )
    assert update["remembered"][0]["action"] == "created"
    assert Fact.objects.get(key="opening").scope_key == "agent:demo"


@pytest.mark.django_db
def test_an_episode_without_a_user_is_never_recalled_for_a_user(service, user_factory, client, admin_client):
    reader = user_factory()
    ownerless = service.record_episode(
        started_at=timezone.now(),
        agent_id="demo",
        success=False,
        conversation=[{"role": "user", "content": "my bank pin is 9931"}],
        summary="bank pin 9931",
    )
    mine = service.record_episode(
        started_at=timezone.now(),
        agent_id="demo",
        user_id=reader.pk,
        success=True,
        summary="asked about the bank opening hours",
    )
    as_user = service.recall("bank pin", agent_id="demo", user_id=reader.pk, types=("episodes",), mode="keyword")
    assert [h.id for h in as_user] == [mine.pk]
    as_agent = service.recall("bank pin", agent_id="demo", types=("episodes",), mode="keyword")
    assert [h.id for h in as_agent] == [ownerless.pk]  # the agent alone still sees its runs without a person
    body = admin_client.get("/api/v1/recall/", {"q": "bank pin", "agent_id": "demo", "user": reader.pk}).json()
    assert "9931" not in str(body)


@pytest.mark.django_db
def test_a_long_display_name_does_not_keep_a_person_from_being_identified():
    workflow = make_workflow(slug="plain")
    result = run_workflow(
        workflow, {"type": "chat", "payload": {"user_id": "long", "display_name": "N" * 500, "message": "hi"}}
    )
    assert result.user is not None and not result.state.get("identity_failed")
    assert len(result.user["display_name"]) == 200


@TOOLS_RUN_IN_WORKER_THREADS
def test_a_nul_the_model_wrote_is_refused_by_the_tool_and_the_episode_is_still_recorded(service, fake_model):  # noqa: F811
    """The tool refuses the NUL (an error tool message), and the run's record keeps what happened,
    with the unstorable character replaced, instead of losing the episode to it."""
    fake_model([remember_call("pin", "12\x0034"), AIMessage("Noted.")])
    result = run_workflow(
        make_workflow(slug="nul"), {"type": "chat", "payload": {"user_id": "nul", "message": "my pin"}}
    )
    [action] = result.state["actions"]
    assert action["status"] == "error" and "NUL" in action["result"]
    episode = Episode.objects.get(pk=result.episode_id)
    assert episode.actions[0]["args"]["value"] == "12\ufffd34"
    assert not Fact.objects.filter(key="pin").exists()
