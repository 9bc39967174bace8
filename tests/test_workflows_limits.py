"""Per-person caps in workflows: facts (MEMORY LIMITS MAX_FACTS_PER_USER) and checkpoint bytes
(WORKFLOWS MAX_CHECKPOINT_BYTES_PER_USER), on by default, refused with an error naming the limit."""

import pytest

from memory.exceptions import LimitReached
from memory.models import Episode, Fact
from tests.workflow_helpers import saved, talk
from workflows import langgraph as engram
from workflows.conf import workflow_settings
from workflows.conversations import threads
from workflows.conversations import upkeep as lifecycle
from workflows.models import Thread


def cap_checkpoints(settings, value):
    settings.WORKFLOWS = {**settings.WORKFLOWS, "MAX_CHECKPOINT_BYTES_PER_USER": value}


def stored_bytes(thread_id):
    saver = engram.get_checkpointer()
    return sum(threads.checkpoint_size(saver, item.checkpoint) for item in saved(thread_id))


def test_a_threads_checkpoint_bytes_are_counted_and_trimming_recounts_them(demo_workflow):
    assert workflow_settings.MAX_CHECKPOINT_BYTES_PER_USER == 20 * 1024 * 1024  # on without any setting
    first = talk(demo_workflow, "ada", "my name is Ada")
    talk(demo_workflow, "ada", "what is my name?")
    thread = Thread.objects.get(thread_id=first.thread_id)
    assert thread.checkpoint_bytes == stored_bytes(first.thread_id) > 0
    assert threads.checkpoint_bytes_of(first.user["id"]) == thread.checkpoint_bytes
    lifecycle.trim_thread(first.thread_id, keep=1)
    thread.refresh_from_db()
    assert thread.checkpoint_count == 1 and thread.checkpoint_bytes == stored_bytes(first.thread_id)


def test_a_person_at_the_checkpoint_cap_is_answered_without_conversation_memory(demo_workflow, settings):
    cap_checkpoints(settings, 1)  # the first turn starts under it; every later one is refused
    first = talk(demo_workflow, "ada", "my name is Ada")
    assert first.memory_errors == []
    kept = len(saved(first.thread_id))
    second = talk(demo_workflow, "ada", "what is my name?")
    (error,) = second.memory_errors
    assert (error["node"], error["operation"]) == ("agent", "conversation memory")
    assert "MAX_CHECKPOINT_BYTES_PER_USER" in error["error"] and "the limit is 1 " in error["error"]
    # Answered (recall still works), reported, and not kept: the thread did not grow.
    assert "Ada" in second.reply and len(saved(first.thread_id)) == kept
    assert Episode.objects.get(pk=second.episode_id).success is False
    # Bob is not held by Ada's cap; with room again, Ada's turns are kept.
    assert talk(demo_workflow, "bob", "hello").memory_errors == []
    cap_checkpoints(settings, None)
    assert talk(demo_workflow, "ada", "hello again").memory_errors == []
    assert len(saved(first.thread_id)) > kept


def test_conversation_refuses_a_turn_past_the_checkpoint_cap(service, user_factory, settings):
    from langgraph.graph import START, MessagesState, StateGraph

    cap_checkpoints(settings, 1)  # first: a change of WORKFLOWS closes the shared checkpointer
    graph = StateGraph(MessagesState)
    graph.add_node("say", lambda state: {"messages": [("ai", "hi")]})
    graph.add_edge(START, "say")
    app = graph.compile(checkpointer=engram.get_checkpointer())
    ada = user_factory("ada")
    with engram.conversation("greeter", user_id=ada.pk) as config:
        app.invoke({"messages": [("user", "hello")]}, config)
    before = Thread.objects.get(user=ada)
    assert before.checkpoint_bytes > 1
    with pytest.raises(LimitReached) as caught:
        with engram.conversation("greeter", user_id=ada.pk) as config:
            app.invoke({"messages": [("user", "hello")]}, config)  # pragma: no cover - never runs
    assert caught.value.limit == "MAX_CHECKPOINT_BYTES_PER_USER" and caught.value.field == "conversation"
    assert Thread.objects.get(user=ada).checkpoint_count == before.checkpoint_count


def test_a_run_past_the_fact_cap_reports_it_and_stores_nothing_new(demo_workflow, settings):
    settings.MEMORY = {**getattr(settings, "MEMORY", {}), "LIMITS": {"MAX_FACTS_PER_USER": 1}}
    first = talk(demo_workflow, "ada", "my name is Ada")
    assert [r["action"] for r in first.remembered] == ["created"]
    second = talk(demo_workflow, "ada", "my city is Paris")
    (report,) = second.remembered
    assert (report["key"], report["action"]) == ("city", "failed")
    assert "MAX_FACTS_PER_USER" in report["error"]
    (error,) = second.memory_errors
    assert error["node"] == "remember" and "MAX_FACTS_PER_USER" in error["error"]
    assert list(Fact.objects.values_list("key", flat=True)) == ["name"]
    assert Episode.objects.get(pk=second.episode_id).success is False
    # Her name still updates: the cap refuses new keys only.
    assert [r["action"] for r in talk(demo_workflow, "ada", "my name is Ada Lovelace").remembered] == ["updated"]
