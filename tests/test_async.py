"""Async LangGraph code on Engram: awaitable service calls, nodes and tools that never block the event loop."""

import asyncio
import threading
import time
from typing import Annotated, TypedDict

import pytest
from conftest import hold_the_database
from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

from memory.models import Fact
from memory.service import MemoryService
from tests.test_langgraph_api import ToolCallingFake
from workflows import langgraph as engram

pytestmark = pytest.mark.django_db(transaction=True)  # the sync worker thread has its own connection


def test_awaitable_service_calls_answer_as_the_sync_ones(user_factory):
    ada = user_factory("ada")

    async def main():
        memory = MemoryService()
        write = await memory.aset_fact("drink", "tea", scope="user", user_id=ada.pk)
        fact = await memory.aget_fact("drink", user_id=ada.pk)
        hits = await memory.arecall("what does she drink", user_id=ada.pk)
        identified = await memory.aidentify("test", "ada")
        return write.action, fact.value, [h.item.key for h in hits if h.kind == "fact"], identified.context.user_id

    assert asyncio.run(main()) == ("created", "tea", ["drink"], ada.pk)


class State(TypedDict, total=False):
    trigger: dict
    messages: Annotated[list, add_messages]
    user: dict
    memories: dict
    facts_to_remember: list
    remembered: list
    memory_errors: list


def test_a_graph_on_ainvoke_leaves_the_event_loop_free_while_memory_waits(user_factory):
    user_factory("ada")
    graph = StateGraph(State)
    graph.add_sequence(
        [
            ("identify_user", engram.identify_user()),
            ("recall", engram.recall(agent_id="bot")),
            ("reply", lambda state: {"facts_to_remember": [{"key": "drink", "value": "tea"}]}),
            ("remember", engram.remember(agent_id="bot")),
        ]
    )
    graph.add_edge(START, "identify_user")
    app = graph.compile()
    started = threading.Event()
    blocker = threading.Thread(target=hold_the_database, args=(0.6, started))
    blocker.start()
    started.wait(5)

    async def main():
        ticks = []

        async def ticker():
            while True:
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        began = time.perf_counter()
        out = await app.ainvoke(
            {
                "trigger": {
                    "type": "chat",
                    "payload": {"user_name": "ada", "channel": "test", "message": "I drink tea"},
                },
                "messages": [("user", "I drink tea")],
            }
        )
        took = time.perf_counter() - began
        task.cancel()
        gaps = [b - a for a, b in zip(ticks, ticks[1:])]
        return out, took, max(gaps)

    out, took, longest_gap = asyncio.run(main())
    blocker.join()
    assert took > 0.3  # the run really waited for the other writer
    assert longest_gap < 0.2  # and the loop kept ticking meanwhile
    assert [r["action"] for r in out["remembered"]] == ["created"]
    assert Fact.objects.get(key="drink").value == "tea"


def test_concurrent_memory_calls_run_side_by_side(user_factory):
    """One call waiting for the write lock holds up no other (the graphs of a LangGraph server, say):
    the calls run on the event loop's worker threads, not one after another on a single thread."""
    ada = user_factory("ada")
    memory = MemoryService()
    memory.set_fact("drink", "tea", scope="user", user_id=ada.pk)
    assert memory.recall("drink", user_id=ada.pk)  # SQLite: the keyword index has caught up with the write
    started, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=hold_the_database, args=(30, started, release))
    holder.start()
    assert started.wait(10)

    async def main():
        writing = asyncio.create_task(memory.aset_fact("food", "figs", scope="user", user_id=ada.pk))
        await asyncio.sleep(0.3)  # the write is waiting for the lock now
        hits = await asyncio.wait_for(memory.arecall("drink", user_id=ada.pk), timeout=4)
        done = writing.done()
        release.set()
        return [h.item.key for h in hits if h.kind == "fact"], done, (await writing).action

    try:
        assert asyncio.run(main()) == (["drink"], False, "created")
    finally:
        release.set()
        holder.join(10)


def test_memory_tools_are_awaited_by_an_async_agent(user_factory):
    ada = user_factory("ada")
    model = ToolCallingFake(
        messages=iter(
            [
                AIMessage(
                    content="", tool_calls=[{"name": "remember", "args": {"key": "pet", "value": "cat"}, "id": "1"}]
                ),
                AIMessage(content="Done."),
            ]
        )
    )
    agent = create_agent(model, engram.memory_tools(agent_id="bot", user_id=ada.pk))
    out = asyncio.run(agent.ainvoke({"messages": [("user", "I have a cat")]}))
    assert [m.content for m in out["messages"] if m.type == "tool"][0].startswith("Remembered pet = cat")
    assert Fact.objects.get(key="pet", user=ada).value == "cat"
