"""The agent node: ReAct with memory tools (LangChain's fake chat models), conversation memory, trimming."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from memory.models import Episode, Fact
from workflows.conversations import threads
from workflows.conversations.checkpointer import get_checkpointer
from workflows.graph.agent import NUDGE, trim_history
from workflows.graph.offline import FALLBACK_MESSAGE_ID
from workflows.graph.runtime import run_workflow
from workflows.models import Thread, Workflow

REPO = Path(__file__).resolve().parent.parent
# LangGraph's ToolNode runs tools in worker threads, each with its own database connection: the
# test's data must be committed for them to see it (and, on SQLite, to take the write lock).
TOOLS_RUN_IN_WORKER_THREADS = pytest.mark.django_db(transaction=True)

# Every model call's input, in order, across instances (pydantic copies mutable field defaults).
MODEL_CALLS = []


class ToolCallingFake(FakeMessagesListChatModel):
    """LangChain's fake chat model, taking tools (it plays its scripted responses whatever they are)."""

    def bind_tools(self, tools, **kwargs):
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        MODEL_CALLS.append(list(messages))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


@pytest.fixture
def fake_model(settings):
    """use(responses): configure the agent's chat model to play these AIMessages in order."""
    MODEL_CALLS.clear()

    def use(responses):
        settings.WORKFLOWS = {
            **settings.WORKFLOWS,
            "CHAT_MODEL": {"class": f"{__name__}.ToolCallingFake", "kwargs": {"responses": responses}},
        }

    yield use
    MODEL_CALLS.clear()


def without_memory(messages):
    """A model call's messages without the recalled-memory message the prompt adds to each call."""
    return [m for m in messages if getattr(m, "name", None) != "memory"]


def make_workflow(slug="helper", **agent_config):
    config = {"tools": {"recall": {"memory_type": "all"}, "remember": {}}, **agent_config}
    return Workflow.objects.create(
        slug=slug,
        name=slug,
        definition={
            "nodes": [
                {"id": "identify_user", "type": "identify_user"},
                {"id": "recall", "type": "recall"},
                {"id": "agent", "type": "agent", "config": {"system_prompt": "You are Helper.", **config}},
                {"id": "remember", "type": "remember"},
            ],
            "edges": [
                {"source": "START", "target": "identify_user"},
                {"source": "identify_user", "target": "recall"},
                {"source": "recall", "target": "agent"},
                {"source": "agent", "target": "remember"},
            ],
        },
    )


def chat(workflow, text, user="ada"):
    return run_workflow(workflow, {"type": "chat", "payload": {"user_id": user, "message": text}})


def call(name, args, call_id):
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"}])


@TOOLS_RUN_IN_WORKER_THREADS
def test_remember_and_recall_tools_act_for_the_identified_user(transactional_db, fake_model):
    fake_model(
        [
            call("remember", {"key": "name", "value": "Ada", "fact_type": "relationship"}, "c1"),
            AIMessage(content="Nice to meet you, Ada."),
            call("recall", {"key": "name"}, "c2"),
            AIMessage(content="You are Ada."),
        ]
    )
    workflow = make_workflow()
    first = chat(workflow, "I am Ada")
    assert first.reply == "Nice to meet you, Ada." and first.memory_errors == []
    fact = Fact.objects.get(key="name")
    assert (fact.scope, fact.user_id, fact.value, fact.fact_type) == ("user", first.user["id"], "Ada", "relationship")
    episode = Episode.objects.get(pk=first.episode_id)
    assert episode.actions == [
        {
            "tool": "remember",
            "args": {"key": "name", "value": "Ada", "fact_type": "relationship"},
            "result": "Remembered name = Ada for this user (created).",
            "status": "success",
        }
    ]
    second = chat(workflow, "who am I?")
    assert second.reply == "You are Ada."
    tool_message = [m for m in MODEL_CALLS[-1] if isinstance(m, ToolMessage)][-1]
    assert tool_message.content.startswith("name = Ada (user")


@TOOLS_RUN_IN_WORKER_THREADS
def test_tools_see_only_their_own_users_facts(transactional_db, fake_model, service):
    fake_model([call("recall", {"query": "name"}, "c1"), AIMessage(content="done")])
    workflow = make_workflow()
    bob, _ = service.get_or_create_user("chat", "bob")
    service.set_fact("name", "Bob", scope="user", user_id=bob.pk)
    chat(workflow, "what is my name?", user="ada")
    tool_message = [m for m in MODEL_CALLS[-1] if isinstance(m, ToolMessage)][-1]
    assert "Bob" not in tool_message.content
    assert tool_message.content == "Nothing in memory matches 'name'."


@TOOLS_RUN_IN_WORKER_THREADS
def test_a_failing_tool_becomes_an_error_tool_message_and_is_logged(transactional_db, fake_model, caplog):
    fake_model(
        [call("remember", {"key": "name", "value": "Ada", "fact_type": "gossip"}, "c1"), AIMessage(content="Sorry.")]
    )
    with caplog.at_level(logging.WARNING, logger="engram.workflows"):
        result = chat(make_workflow(), "remember my name")
    tool_message = [m for m in MODEL_CALLS[-1] if isinstance(m, ToolMessage)][-1]
    assert tool_message.status == "error"
    assert "fact_type" in tool_message.content and "gossip" in tool_message.content
    assert "memory tool remember failed" in caplog.text
    assert not Fact.objects.exists()
    assert Episode.objects.get(pk=result.episode_id).actions[0]["status"] == "error"


def test_system_prompt_once_per_model_call_and_never_stored(db, fake_model):
    """The system prompt holds the operator's words only; recalled memory, which users' words fill and
    which is marked untrusted, comes as its own message before the latest one, and is never stored."""
    fake_model([AIMessage(content=f"reply {i}") for i in range(3)])
    workflow = make_workflow()
    for i in range(3):
        result = chat(workflow, f"turn {i}")
    assert len(MODEL_CALLS) == 3
    for messages in MODEL_CALLS:
        systems = [m for m in messages if isinstance(m, SystemMessage)]
        assert len(systems) == 1 and messages[0] is systems[0]
        assert systems[0].content == "You are Helper."
        memory = [m for m in messages if getattr(m, "name", None) == "memory"]
        assert len(memory) == 1 and isinstance(memory[0], HumanMessage) and "<recalled-memory>" in memory[0].content
        assert messages[-2] is memory[0]  # right before the latest human message
    assert [m.content for m in MODEL_CALLS[-1][1:-2]] == ["turn 0", "reply 0", "turn 1", "reply 1"]
    assert MODEL_CALLS[-1][-1].content == "turn 2"
    stored = get_checkpointer().get_tuple({"configurable": {"thread_id": result.thread_id}}).checkpoint
    assert not any(
        isinstance(m, SystemMessage) or getattr(m, "name", None) == "memory"
        for m in stored["channel_values"]["messages"]
    )


def test_fallback_system_prompt_is_one_stable_message_across_turns(db, fake_model):
    fake_model([AIMessage(content=f"reply {i}") for i in range(3)])
    workflow = make_workflow(system_prompt_fallback=True)
    for i in range(3):
        result = chat(workflow, f"turn {i}")
    for messages in MODEL_CALLS:
        fallbacks = [m for m in messages if m.id == FALLBACK_MESSAGE_ID]
        assert len(fallbacks) == 1 and fallbacks[0] is messages[1]  # right after the SystemMessage
        assert isinstance(fallbacks[0], HumanMessage) and "You are Helper." in fallbacks[0].content
    stored = get_checkpointer().get_tuple({"configurable": {"thread_id": result.thread_id}}).checkpoint
    assert sum(m.id == FALLBACK_MESSAGE_ID for m in stored["channel_values"]["messages"]) == 1


def test_history_is_trimmed_and_never_starts_with_an_ai_message(db, fake_model):
    fake_model([AIMessage(content=f"reply {i}") for i in range(6)])
    workflow = make_workflow(history_limit=3, summarize_history=False)
    for i in range(6):
        result = chat(workflow, f"turn {i}")
    for messages in MODEL_CALLS:
        history = without_memory(messages[1:])
        assert len(history) <= 3 and isinstance(history[0], HumanMessage)
    assert [m.content for m in without_memory(MODEL_CALLS[-1][1:])] == ["turn 4", "reply 4", "turn 5"]
    assert [m.content for m in without_memory(MODEL_CALLS[-2][1:])] == ["turn 3", "reply 3", "turn 4"]
    stored = get_checkpointer().get_tuple({"configurable": {"thread_id": result.thread_id}}).checkpoint
    messages = stored["channel_values"]["messages"]
    assert len(messages) <= 4 and isinstance(messages[0], HumanMessage)


def system_text(messages):
    return next(m.content for m in messages if isinstance(m, SystemMessage))


@TOOLS_RUN_IN_WORKER_THREADS
def test_the_memory_nudge_comes_after_turns_without_a_write_and_is_never_stored(transactional_db, fake_model):
    fake_model(
        [
            AIMessage(content="reply 0"),
            AIMessage(content="reply 1"),
            call("remember", {"key": "drink", "value": "tea", "fact_type": "user_preference"}, "c1"),
            AIMessage(content="Noted."),
            AIMessage(content="reply 3"),
        ]
    )
    workflow = make_workflow(nudge_after_turns=2)
    for text in ["hi", "I like tea", "remember that", "bye"]:
        result = chat(workflow, text)
    nudged = [NUDGE in system_text(messages) for messages in MODEL_CALLS]
    # Turns 0 and 1 write nothing; turn 2 is nudged until its remember call succeeds; the write resets the count.
    assert nudged == [False, False, True, False, False]
    assert Fact.objects.get(key="drink").value == "tea"
    stored = get_checkpointer().get_tuple({"configurable": {"thread_id": result.thread_id}}).checkpoint
    assert stored["channel_values"]["turns_without_memory_write"] == 1
    assert not any(NUDGE in str(m.content) for m in stored["channel_values"]["messages"])
    episode = Episode.objects.get(pk=result.episode_id)
    assert NUDGE not in json.dumps(episode.conversation)


def test_an_agent_that_cannot_write_to_memory_is_never_nudged(db, fake_model):
    fake_model([AIMessage(content=f"reply {i}") for i in range(4)])
    workflow = make_workflow(nudge_after_turns=1, tools={"recall": {}})
    for i in range(4):
        chat(workflow, f"turn {i}")
    assert len(MODEL_CALLS) == 4 and not any(NUDGE in system_text(messages) for messages in MODEL_CALLS)


def test_trim_history_keeps_tool_calls_with_their_results():
    history = [
        HumanMessage("a", id="1"),
        AIMessage("b", id="2"),
        HumanMessage("c", id="3"),
        AIMessage("", id="4", tool_calls=[{"name": "recall", "args": {}, "id": "t", "type": "tool_call"}]),
        ToolMessage("r", tool_call_id="t", id="5"),
        AIMessage("d", id="6"),
    ]
    assert [m.id for m in trim_history(history, 3)] == ["3", "4", "5", "6"]  # the turn is kept whole
    assert [m.id for m in trim_history(history, 5)] == ["3", "4", "5", "6"]
    assert [m.id for m in trim_history(history, 10)] == ["1", "2", "3", "4", "5", "6"]
    assert [m.id for m in trim_history(history[1:], 10)] == ["3", "4", "5", "6"]  # never an AI message first


def test_conversation_memory_off_leaves_no_thread(db, fake_model):
    fake_model([AIMessage(content="one"), AIMessage(content="two")])
    workflow = make_workflow(conversation_memory=False)
    chat(workflow, "first")
    result = chat(workflow, "second")
    # The conversation (the session) is still known; no history is kept for it.
    assert result.thread_id == f"{result.user['id']}:direct:{workflow.pk}" and not Thread.objects.exists()
    assert not threads.list_checkpoints(result.thread_id)
    assert [m.content for m in without_memory(MODEL_CALLS[-1][1:])] == ["second"]


def test_thread_is_tracked_with_its_checkpoints(db, fake_model):
    fake_model([AIMessage(content="one"), AIMessage(content="two")])
    workflow = make_workflow()
    first = chat(workflow, "first")
    assert first.thread_id == f"{first.user['id']}:direct:{workflow.pk}"
    row = Thread.objects.get()
    count = row.checkpoint_count
    assert count > 0 and count == len(threads.list_checkpoints(first.thread_id))
    chat(workflow, "second")
    row.refresh_from_db()
    assert row.checkpoint_count == len(threads.list_checkpoints(first.thread_id)) > count


def _manage(env, *args):
    return subprocess.run(
        [sys.executable, str(REPO / "manage.py"), *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def test_conversation_memory_survives_a_restart(tmp_path):
    """Two separate processes, one checkpoint file: the second continues the first's conversation."""
    env = {
        **os.environ,
        "ENGRAM_DATA_DIR": str(tmp_path),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'restart.sqlite3'}",
        "PYTHONWARNINGS": "ignore",
    }
    _manage(env, "migrate", "--no-input", "-v0")
    _manage(env, "setup_demo")
    _manage(env, "run_workflow", "demo", "--user", "chat:ada", "--message", "hello from the first process")
    second = _manage(env, "run_workflow", "demo", "--user", "chat:ada", "--message", "and from the second", "--json")
    thread_id = json.loads(second.stdout)["thread_id"]
    script = (
        "import sqlite3, sys, json\n"
        "from langgraph.checkpoint.sqlite import SqliteSaver\n"
        "saver = SqliteSaver(sqlite3.connect(sys.argv[1]))\n"
        "state = saver.get_tuple({'configurable': {'thread_id': sys.argv[2]}}).checkpoint\n"
        "print(json.dumps([m.content for m in state['channel_values']['messages'] if m.type == 'human']))\n"
    )
    third = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "checkpoints.db"), thread_id],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(third.stdout) == ["hello from the first process", "and from the second"]


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ({"class": "no.such.Model"}, "CHAT_MODEL.class"),
        ({"class": f"{__name__}.ToolCallingFake", "kwargs": ["x"]}, "CHAT_MODEL.kwargs"),
        ({"temperature": 0}, "needs 'class'"),
        ("gpt", "must be a dict"),
    ],
)
def test_a_bad_chat_model_setting_names_the_key(spec, fragment):
    from workflows.exceptions import ChatModelConfigError
    from workflows.graph.chat_models import build_chat_model

    with pytest.raises(ChatModelConfigError, match=fragment):
        build_chat_model(spec)


def test_a_chat_model_from_an_import_string_with_kwargs():
    from workflows.graph.chat_models import build_chat_model

    model = build_chat_model(
        {"class": f"{__name__}.ToolCallingFake", "kwargs": {"responses": [AIMessage(content="hi")]}}
    )
    assert isinstance(model, ToolCallingFake) and model.invoke("hello").content == "hi"


def test_an_openai_compatible_server_by_base_url():
    from workflows.exceptions import ChatModelConfigError
    from workflows.graph.chat_models import build_chat_model

    spec = {"base_url": "http://127.0.0.1:9/v1", "api_key": "k", "model": "local-model"}
    try:
        from langchain_openai import ChatOpenAI
    except ImportError:
        with pytest.raises(ChatModelConfigError, match=r"engram\[openai\]"):
            build_chat_model(spec)
    else:
        model = build_chat_model(spec)
        assert isinstance(model, ChatOpenAI) and model.model_name == "local-model"


def test_the_demo_uses_a_configured_model_instead_of_the_offline_responder(demo_workflow, fake_model):
    fake_model([AIMessage(content="Hello from the model.")])
    result = chat(demo_workflow, "hi")
    assert result.reply == "Hello from the model." and len(MODEL_CALLS) == 1
    # With a model, the tools are offered and facts come from its remember calls, not from parsing.
    assert result.remembered == []


def test_a_failing_checkpointer_is_reported_and_the_turn_still_answered(db, fake_model, monkeypatch, caplog):
    import sqlite3

    import psycopg
    from langgraph.checkpoint.sqlite import SqliteSaver

    fake_model([AIMessage(content="answered anyway")])
    workflow = make_workflow()
    saver_class = type(get_checkpointer())
    error = sqlite3.OperationalError if saver_class is SqliteSaver else psycopg.OperationalError

    def locked(self, config):
        raise error("database is locked")

    monkeypatch.setattr(saver_class, "get_tuple", locked)  # the library's saver fails, not our code
    with caplog.at_level(logging.ERROR, logger="engram.workflows"):
        result = chat(workflow, "hello")
    assert result.reply == "answered anyway" and result.thread_id == f"{result.user['id']}:direct:{workflow.pk}"
    assert result.memory_errors == [
        {"node": "agent", "operation": "conversation memory", "error": "database is locked"}
    ]
    assert "conversation memory failed" in caplog.text
    assert Episode.objects.get(pk=result.episode_id).success is False
    assert not Thread.objects.exists()


class SlowFake(ToolCallingFake):
    """Takes its time, so two turns of one person overlap."""

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        import time

        time.sleep(0.3)
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


@pytest.mark.django_db(transaction=True)
def test_two_quick_messages_of_one_person_both_stay_in_the_history(settings, run_in_threads):
    MODEL_CALLS.clear()
    settings.WORKFLOWS = {
        **settings.WORKFLOWS,
        "CHAT_MODEL": {"class": f"{__name__}.SlowFake", "kwargs": {"responses": [AIMessage(content="ok")]}},
    }
    workflow = make_workflow(conversation_memory=True, tools={})
    first = chat(workflow, "first")
    run_in_threads(lambda n: chat(workflow, f"quick {n}"), 2)
    stored = get_checkpointer().get_tuple({"configurable": {"thread_id": first.thread_id}}).checkpoint
    humans = [m.content for m in stored["channel_values"]["messages"] if isinstance(m, HumanMessage)]
    assert humans[0] == "first" and sorted(humans[1:]) == ["quick 0", "quick 1"]
    assert Thread.objects.get().checkpoint_count == len(threads.list_checkpoints(first.thread_id))
    MODEL_CALLS.clear()
