"""EngramMemoryMiddleware: Engram's memory in an agent of the developer's own (LangChain's create_agent).

The agents here are LangChain's real `create_agent` graphs; only the chat model is LangChain's fake
one, which records what it was sent so the tests can see what reached the model.
"""

import asyncio
from dataclasses import dataclass

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from memory.exceptions import InvalidMemoryArgument, MemoryNotFound
from memory.models import Episode
from workflows.langgraph import EngramMemoryMiddleware

# LangGraph runs tools (and async hooks) in worker threads with their own database connections.
pytestmark = pytest.mark.django_db(transaction=True)


class RecordingFake(GenericFakeChatModel):
    """LangChain's fake chat model, keeping the messages of each call (tool calling included)."""

    calls: list = []

    def bind_tools(self, tools, **kwargs):
        return self

    def _generate(self, messages, *args, **kwargs):
        self.calls.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def model(*replies):
    return RecordingFake(messages=iter(replies), calls=[])


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def memory_block(messages):
    blocks = [m for m in messages if isinstance(m, HumanMessage) and m.name == "memory"]
    assert len(blocks) <= 1
    return blocks[0] if blocks else None


def test_the_model_gets_the_users_memory_as_untrusted_hints_and_the_turn_becomes_an_episode(service, user_factory):
    ada, bob = user_factory("ada"), user_factory("bob")
    service.set_fact("drink", "green tea", scope="user", user_id=ada.pk)
    service.set_fact("drink", "black coffee", scope="user", user_id=bob.pk)
    fake = model(
        AIMessage(content="", tool_calls=[{"name": "weather", "args": {"city": "Lisbon"}, "id": "w1"}]),
        AIMessage(content="Green tea, and it is sunny in Lisbon."),
    )
    agent = create_agent(fake, [weather], middleware=[EngramMemoryMiddleware(agent_id="helper")])
    out = agent.invoke(
        {"messages": [("user", "what do I drink, and the weather in Lisbon?")]}, context={"user_id": ada.pk}
    )

    # Each model call: the recalled-memory block, marked untrusted, just before the human message.
    assert len(fake.calls) == 2
    for sent in fake.calls:
        block = memory_block(sent)
        assert block is not None
        assert sent[sent.index(block) + 1].content == "what do I drink, and the weather in Lisbon?"
        assert "<recalled-memory>" in block.content and "UNTRUSTED HINTS" in block.content
        assert "green tea" in block.content and "black coffee" not in block.content  # Ada's, never Bob's
    # Never part of the agent's state (so never checkpointed).
    assert memory_block(out["messages"]) is None
    # The turn is one episode of the agent with Ada: her words, the reply, the tool call, a success.
    episode = Episode.objects.get()
    assert (episode.user_id, episode.agent_id, episode.success, episode.error) == (ada.pk, "helper", True, "")
    assert episode.conversation == [
        {"role": "user", "content": "what do I drink, and the weather in Lisbon?"},
        {"role": "assistant", "content": "Green tea, and it is sunny in Lisbon."},
    ]
    assert episode.final_output == {"reply": "Green tea, and it is sunny in Lisbon."}
    assert [(a["tool"], a["args"], a["result"]) for a in episode.actions] == [
        ("weather", {"city": "Lisbon"}, "sunny in Lisbon")
    ]
    assert out["episode_id"] == episode.pk and not out.get("memory_errors")


@dataclass
class AppContext:
    user_id: int
    tenant: str = "acme"


def test_the_user_comes_from_a_context_object_or_the_config_and_the_thread_is_the_session(service, user_factory):
    ada = user_factory("ada")
    service.set_fact("city", "Porto", scope="user", user_id=ada.pk)
    fake = model(AIMessage(content="Porto."))
    agent = create_agent(
        fake,
        [],
        middleware=[EngramMemoryMiddleware(agent_id="helper")],
        context_schema=AppContext,
    )
    agent.invoke({"messages": [("user", "where do I live?")]}, context=AppContext(user_id=ada.pk))
    config = {"configurable": {"thread_id": "t-1", "user_id": ada.pk}}
    agent2 = create_agent(
        model(AIMessage(content="Still Porto.")),
        [],
        middleware=[EngramMemoryMiddleware(agent_id="helper")],
        checkpointer=InMemorySaver(),
    )
    out = agent2.invoke({"messages": [("user", "and now?")]}, config)
    assert "Porto" in memory_block(fake.calls[0]).content
    first, second = Episode.objects.order_by("pk")
    assert (first.user_id, first.session_id, second.user_id, second.session_id) == (ada.pk, "", ada.pk, "t-1")
    assert second.success and out["episode_id"] == second.pk
    # The checkpoint of the thread holds the conversation, never the recalled memory.
    stored = agent2.get_state(config).values["messages"]
    assert [m.content for m in stored] == ["and now?", "Still Porto."]


def test_without_a_user_only_shared_memory_is_recalled_nothing_is_recorded_and_the_state_says_why(
    service, user_factory
):
    ada = user_factory("ada")
    service.set_fact("drink", "green tea", scope="user", user_id=ada.pk)
    service.set_fact("opening_hours", "9 to 5", scope="agent", agent_id="helper")
    fake = model(AIMessage(content="We open at 9."))
    agent = create_agent(fake, [], middleware=[EngramMemoryMiddleware(agent_id="helper")])
    out = agent.invoke({"messages": [("user", "what are your opening hours and what do I drink?")]})
    block = memory_block(fake.calls[0]).content
    assert "9 to 5" in block and "green tea" not in block
    assert out["messages"][-1].content == "We open at 9."
    assert not Episode.objects.exists() and out["episode_id"] is None
    [error] = out["memory_errors"]
    assert error["operation"] == "identify" and error["error"].startswith("user_id:")


@pytest.mark.parametrize(
    ("user_id", "raised"), [("ada", InvalidMemoryArgument), (True, InvalidMemoryArgument), (10**9, MemoryNotFound)]
)
def test_a_bad_or_unknown_user_id_is_refused_before_the_model_runs(db, user_id, raised):
    fake = model(AIMessage(content="never"))
    agent = create_agent(fake, [], middleware=[EngramMemoryMiddleware(agent_id="helper")])
    with pytest.raises(raised) as caught:
        agent.invoke({"messages": [("user", "hi")]}, context={"user_id": user_id})
    assert "user_id" in str(caught.value) or "memory user" in str(caught.value)
    if raised is InvalidMemoryArgument:
        assert caught.value.field == "user_id"
    assert fake.calls == [] and not Episode.objects.exists()


def test_a_person_forgotten_during_the_turn_is_reported_and_no_episode_is_left(service, user_factory):
    ada = user_factory("ada")

    @tool
    def forget_me() -> str:
        """Forget the person."""
        service.delete_users([ada.pk], cascade=True)
        return "forgotten"

    fake = model(
        AIMessage(content="", tool_calls=[{"name": "forget_me", "args": {}, "id": "f1"}]),
        AIMessage(content="Done."),
    )
    agent = create_agent(fake, [forget_me], middleware=[EngramMemoryMiddleware(agent_id="helper")])
    out = agent.invoke({"messages": [("user", "forget me")]}, context={"user_id": ada.pk})
    assert out["messages"][-1].content == "Done."
    assert not Episode.objects.exists() and out["episode_id"] is None
    # Each memory step after the forget says so: its recall finds the person gone, its episode too.
    assert [e["operation"] for e in out["memory_errors"]] == ["recall", "record_episode"]


def test_the_middleware_runs_under_ainvoke(service, user_factory):
    ada = user_factory("ada")
    service.set_fact("pet", "a parrot", scope="user", user_id=ada.pk)
    fake = model(AIMessage(content="A parrot."))
    agent = create_agent(fake, [], middleware=[EngramMemoryMiddleware(agent_id="helper")])
    out = asyncio.run(agent.ainvoke({"messages": [("user", "what pet do I have?")]}, context={"user_id": ada.pk}))
    assert "a parrot" in memory_block(fake.calls[0]).content
    episode = Episode.objects.get()
    assert (episode.user_id, episode.success, out["episode_id"]) == (ada.pk, True, episode.pk)


def test_a_blank_agent_id_is_refused():
    with pytest.raises(InvalidMemoryArgument) as caught:
        EngramMemoryMiddleware(agent_id=" ")
    assert caught.value.field == "agent_id"
