"""Workflows in memory's upkeep: checkpoint and thread limits through `memory prune`, the checkpointer on /healthz."""

import json

import pytest
from django.core.management import call_command
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from memory.service import MemoryService
from tests.workflow_helpers import saved, talk
from workflows.conversations import upkeep as lifecycle
from workflows.graph.runtime import run_workflow
from workflows.models import Thread


def test_trimming_keeps_the_newest_checkpoints_and_the_thread_resumes(demo_workflow):
    for text in ["my name is Ada", "my city is Paris", "hello", "how are you"]:
        result = talk(demo_workflow, "ada", text)
    thread_id = result.thread_id
    before = saved(thread_id)
    assert len(before) > 2
    newest_ids = [c.config["configurable"]["checkpoint_id"] for c in before[:2]]
    newest_messages = before[0].checkpoint["channel_values"]["messages"]

    assert lifecycle.trim_thread(thread_id, keep=2) == len(before) - 2

    after = saved(thread_id)
    assert [c.config["configurable"]["checkpoint_id"] for c in after] == newest_ids
    assert after[0].checkpoint["channel_values"]["messages"] == newest_messages
    assert after[1].parent_config is None  # the oldest kept one no longer points at a deleted parent
    assert Thread.objects.get(thread_id=thread_id).checkpoint_count == 2
    # The conversation goes on from where it was: the history is still there for the next turn.
    again = talk(demo_workflow, "ada", "what is my name?")
    assert again.thread_id == thread_id and "Ada" in again.reply
    latest = saved(thread_id)[0].checkpoint["channel_values"]["messages"]
    assert [m.content for m in latest[: len(newest_messages)]] == [m.content for m in newest_messages]


def test_memory_prune_applies_the_thread_limits(demo_workflow, settings):
    for user in ["ann", "bob", "cy"]:
        for text in ["hello", "hi again", "and again"]:
            talk(demo_workflow, user, text)
    settings.WORKFLOWS = {**settings.WORKFLOWS, "MAX_THREADS_PER_WORKFLOW": 2, "MAX_CHECKPOINTS_PER_THREAD": 1}

    dry = MemoryService().prune(dry_run=True)
    assert dry.deleted["threads"] == 1 and Thread.objects.count() == 3

    report = MemoryService().prune()
    assert report.deleted["threads"] == 1
    assert report.deleted["checkpoints"] > 0
    kept = list(Thread.objects.values_list("thread_id", flat=True))
    assert len(kept) == 2
    assert all(len(saved(t)) == 1 for t in kept)


def test_a_run_trims_its_own_thread_when_it_crosses_the_limit(demo_workflow, settings):
    settings.WORKFLOWS = {**settings.WORKFLOWS, "MAX_CHECKPOINTS_PER_THREAD": 2}
    for text in ["my name is Ada", "hello", "hi", "still here"]:
        result = talk(demo_workflow, "ada", text)
    assert len(saved(result.thread_id)) == 2
    assert "Ada" in talk(demo_workflow, "ada", "what is my name?").reply


def test_trim_refuses_a_limit_below_one(demo_workflow):
    thread_id = talk(demo_workflow, "ada", "hello").thread_id
    with pytest.raises(ValueError, match="keep"):
        lifecycle.trim_thread(thread_id, keep=-1)
    assert saved(thread_id)


def test_healthz_reports_the_checkpointer(client, demo_workflow):
    body = client.get("/healthz").json()
    assert body["checkpointer"] == "ok"


def test_memory_prune_command_reports_threads(demo_workflow, settings, capsys):
    for user in ["ann", "bob"]:
        talk(demo_workflow, user, "hello")
    settings.WORKFLOWS = {**settings.WORKFLOWS, "MAX_THREADS_PER_WORKFLOW": 1}
    call_command("memory", "prune", "--json")
    out = json.loads(capsys.readouterr().out)
    assert out["deleted"]["threads"] == 1
    assert Thread.objects.count() == 1


# ------------------------------------------------------------------ procedures in the prompt


def refund_procedure(**overrides):
    return MemoryService().save_procedure(
        "refund-policy",
        agent_id="demo",
        description="Refunds: ask for the order number first, then confirm the amount.",
        trigger_conditions={"goal_contains": ["refund"]},
        **overrides,
    )


def test_matching_procedures_reach_the_prompt_and_their_outcome_is_recorded(demo_workflow):
    procedure = refund_procedure()
    MemoryService().save_procedure(
        "shipping", agent_id="demo", description="Shipping questions.", trigger_conditions={"goal_contains": ["parcel"]}
    )
    result = talk(demo_workflow, "ada", "I want a refund please")
    prompt = result.state["memory_prompt"]
    assert "Learned Procedures and Policies" in prompt and "refund-policy" in prompt
    assert "shipping" not in prompt
    procedure.refresh_from_db()
    assert (procedure.times_used, procedure.times_succeeded, procedure.success_rate) == (1, 1, 1.0)
    assert procedure.last_used is not None and procedure.avg_duration_ms > 0
    talk(demo_workflow, "ada", "where is my parcel?")
    procedure.refresh_from_db()
    assert procedure.times_used == 1  # not carried by a run it did not match


def test_at_most_prompt_procedures_are_carried(demo_workflow, settings):
    settings.WORKFLOWS = {**settings.WORKFLOWS, "PROMPT_PROCEDURES": 2}
    for n in range(4):
        MemoryService().save_procedure(f"refund-{n}", agent_id="demo", trigger_conditions={"goal_contains": ["refund"]})
    result = talk(demo_workflow, "ada", "a refund")
    assert len(result.state["memories"]["procedures"]) == 2


def test_a_run_with_a_memory_failure_records_a_failed_use(demo_workflow):
    procedure = refund_procedure()
    result = run_workflow(
        demo_workflow,
        {"type": "chat", "payload": {"user_id": "ada", "message": "refund", "channel": "x" * 60}},
    )
    assert result.memory_errors  # identify_user refused the channel; the run still answered
    procedure.refresh_from_db()
    assert (procedure.times_used, procedure.times_failed) == (1, 1)


# ------------------------------------------------------------------ consolidation after a run


def test_runs_are_consolidated_when_set_to(demo_workflow, settings):
    settings.MEMORY = {**settings.MEMORY, "CONSOLIDATION": {"AFTER_EACH_RUN": True}}
    result = talk(demo_workflow, "ada", "remember that the launch is on Friday")
    assert result.memory_errors == []
    episode = MemoryService().get_episode(result.episode_id)
    assert episode.processed_for_facts
    derived = MemoryService().user_facts(result.user["id"])
    assert any(f.source_episode_id == episode.pk and f.provenance == "consolidation" for f in derived)


class BrokenModel(FakeListChatModel):
    def _call(self, *args, **kwargs):
        raise RuntimeError("model unavailable")


def test_a_failing_consolidation_model_leaves_the_run_answered_and_the_episode_unprocessed(demo_workflow, settings):
    settings.MEMORY = {
        **settings.MEMORY,
        **settings.MEMORY,
        "CONSOLIDATION": {
            "AFTER_EACH_RUN": True,
            "EXTRACTOR": "memory.consolidation.LLMExtractor",
            "MODEL": f"{__name__}.BrokenModel",
            "MODEL_KWARGS": {"responses": []},
        },
    }
    result = talk(demo_workflow, "ada", "my name is Ada")
    assert result.reply  # the run answered
    assert [e["operation"] for e in result.memory_errors] == ["consolidate"]
    assert "model unavailable" in result.memory_errors[0]["error"]
    assert not MemoryService().get_episode(result.episode_id).processed_for_facts
    # The remember node stored the fact itself; consolidation failing does not undo it.
    assert any(r["action"] == "created" for r in result.remembered)


def _fail_updates_of_checkpoints():
    """A real failure inside the trim's transaction: the saver's store refuses the parent update
    (a trigger), after the older checkpoints' deletes have run. Returns the undo."""
    from workflows.conversations.checkpointer import checkpointer_kind, get_checkpointer

    saver = get_checkpointer()
    if checkpointer_kind() == "sqlite":
        with saver.lock:
            saver.conn.execute(
                "CREATE TRIGGER refuse_parent_update BEFORE UPDATE ON checkpoints BEGIN SELECT RAISE(ABORT, 'refused'); END"
            )
            saver.conn.commit()
        return lambda: saver.conn.execute("DROP TRIGGER refuse_parent_update")
    with saver.conn.connection() as conn:
        conn.execute(
            "CREATE FUNCTION refuse_update() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$ LANGUAGE plpgsql"
        )
        conn.execute(
            "CREATE TRIGGER refuse_parent_update BEFORE UPDATE ON checkpoints FOR EACH ROW EXECUTE FUNCTION refuse_update()"
        )

    def undo():
        with saver.conn.connection() as conn:
            conn.execute("DROP TRIGGER refuse_parent_update ON checkpoints")
            conn.execute("DROP FUNCTION refuse_update()")

    return undo


def test_a_trim_that_fails_midway_leaves_every_checkpoint(demo_workflow):
    """Trimming is one transaction: a failure after the older checkpoints were deleted undoes the
    deletes (the earlier delete-then-put-back trim lost the conversation at that point)."""
    for text in ["my name is Ada", "my city is Paris", "hello"]:
        result = talk(demo_workflow, "ada", text)
    before = [c.config["configurable"]["checkpoint_id"] for c in saved(result.thread_id)]
    undo = _fail_updates_of_checkpoints()
    try:
        with pytest.raises(Exception, match="refused"):
            lifecycle.trim_thread(result.thread_id, keep=1)
    finally:
        undo()
    assert [c.config["configurable"]["checkpoint_id"] for c in saved(result.thread_id)] == before
    assert "Ada" in talk(demo_workflow, "ada", "what is my name?").reply
