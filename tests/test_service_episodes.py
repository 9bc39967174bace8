"""Episodes through MemoryService: start, messages, actions, completion, lookups."""

import datetime

import pytest
from django.utils import timezone

from memory.exceptions import InvalidMemoryArgument, MemoryNotFound
from memory.models import Episode

pytestmark = pytest.mark.django_db


def test_start_episode(service, user_factory):
    ann = user_factory()
    episode = service.start_episode(
        agent_id=" planner ",
        user_id=ann.pk,
        session_id="s1",
        workflow="support",
        trigger_type="telegram",
        trigger_input={"text": "hi"},
    )
    stored = Episode.objects.get(pk=episode.pk)
    assert (stored.agent_id, stored.user_id, stored.session_id) == ("planner", ann.pk, "s1")
    assert (stored.workflow, stored.trigger_type, stored.trigger_input) == ("support", "telegram", {"text": "hi"})
    assert stored.conversation == [] and stored.actions == []
    assert stored.started_at is not None
    assert (stored.ended_at, stored.duration_ms, stored.success) == (None, None, None)


def test_start_episode_without_anyone(service):
    episode = service.start_episode()
    assert Episode.objects.get(pk=episode.pk).user_id is None


def test_add_message_and_action(service):
    episode = service.start_episode(agent_id="planner")
    service.add_message(episode.pk, "user", "What time is it?")
    service.add_message(episode.pk, "assistant", {"text": "Noon", "tokens": 3})
    service.add_action(episode.pk, {"tool": "clock", "args": {}, "result": "12:00"})
    returned = service.add_action(episode.pk, {"tool": "log", "result": None})
    stored = service.get_episode(episode.pk)
    assert stored.conversation == [
        {"role": "user", "content": "What time is it?"},
        {"role": "assistant", "content": {"text": "Noon", "tokens": 3}},
    ]
    assert stored.actions == [{"tool": "clock", "args": {}, "result": "12:00"}, {"tool": "log", "result": None}]
    assert returned.actions == stored.actions


def test_complete_episode(service):
    episode = service.start_episode(agent_id="planner")
    Episode.objects.filter(pk=episode.pk).update(started_at=timezone.now() - datetime.timedelta(seconds=2))
    done = service.complete_episode(episode.pk, success=True, final_output={"answer": 42}, summary=" answered ")
    stored = Episode.objects.get(pk=episode.pk)
    assert stored.success is True
    assert stored.ended_at is not None and stored.ended_at >= stored.started_at
    assert 2000 <= stored.duration_ms < 60_000
    assert stored.duration_ms == int((stored.ended_at - stored.started_at).total_seconds() * 1000)
    assert stored.final_output == {"answer": 42}
    assert stored.summary == "answered" and stored.error == ""
    assert done.duration_ms == stored.duration_ms


def test_complete_episode_immediately_and_with_failure(service):
    episode = service.start_episode()
    service.complete_episode(episode.pk, success=False, error="tool crashed")
    stored = Episode.objects.get(pk=episode.pk)
    assert stored.success is False and stored.error == "tool crashed"
    assert stored.duration_ms >= 0 and stored.ended_at is not None


def test_unknown_episodes(service):
    for episode_id in (987654, "nope", None):
        with pytest.raises(MemoryNotFound):
            service.get_episode(episode_id)
    with pytest.raises(MemoryNotFound):
        service.add_message(987654, "user", "hi")
    with pytest.raises(MemoryNotFound):
        service.add_action(987654, {"tool": "x"})
    with pytest.raises(MemoryNotFound):
        service.complete_episode(987654, success=True)
    assert Episode.objects.count() == 0


def test_start_episode_for_unknown_user(service):
    with pytest.raises(MemoryNotFound):
        service.start_episode(user_id=987654)
    assert Episode.objects.count() == 0


def snapshot(episode_id):
    return (
        Episode.objects.filter(pk=episode_id)
        .values("conversation", "actions", "success", "ended_at", "duration_ms", "final_output", "error", "summary")
        .get()
    )


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda s, e: s.complete_episode(e, success="yes"), "success"),
        (lambda s, e: s.complete_episode(e, success=1), "success"),
        (lambda s, e: s.complete_episode(e, success=None), "success"),
        (lambda s, e: s.complete_episode(e, success=True, final_output={1, 2}), "final_output"),
        (lambda s, e: s.complete_episode(e, success=True, error=5), "error"),
        (lambda s, e: s.complete_episode(e, success=True, summary=["x"]), "summary"),
        (lambda s, e: s.add_action(e, ["tool", "x"]), "action"),
        (lambda s, e: s.add_action(e, "tool x"), "action"),
        (lambda s, e: s.add_action(e, {"result": object()}), "action"),
        (lambda s, e: s.add_message(e, "", "hi"), "role"),
        (lambda s, e: s.add_message(e, "user", float("nan")), "content"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_arguments_change_nothing(service, call, field):
    episode = service.start_episode(agent_id="planner")
    service.add_message(episode.pk, "user", "hi")
    before = snapshot(episode.pk)
    with pytest.raises(InvalidMemoryArgument) as exc:
        call(service, episode.pk)
    assert exc.value.field == field
    assert snapshot(episode.pk) == before
    assert Episode.objects.count() == 1


@pytest.mark.parametrize(
    "kwargs, field",
    [({"trigger_input": {1, 2}}, "trigger_input"), ({"agent_id": 5}, "agent_id"), ({"user_id": "3"}, "user_id")],
)
def test_start_episode_bad_arguments(service, kwargs, field):
    with pytest.raises(InvalidMemoryArgument) as exc:
        service.start_episode(**kwargs)
    assert exc.value.field == field
    assert Episode.objects.count() == 0


def test_recent_episodes(service, user_factory):
    ann, bob = user_factory(), user_factory()
    base = timezone.now() - datetime.timedelta(hours=1)
    made = {}
    for i, (agent, user) in enumerate(
        [("planner", ann), ("planner", bob), ("writer", ann), ("planner", ann), ("writer", bob), ("planner", None)]
    ):
        episode = service.start_episode(agent_id=agent, user_id=user.pk if user else None, trigger_type=f"t{i}")
        Episode.objects.filter(pk=episode.pk).update(started_at=base + datetime.timedelta(minutes=i))
        made[i] = episode.pk

    def ids(episodes):
        return [e.pk for e in episodes]

    assert ids(service.recent_episodes(agent_id="planner")) == [made[5], made[3], made[1], made[0]]
    assert ids(service.recent_episodes(user_id=ann.pk)) == [made[3], made[2], made[0]]
    assert ids(service.recent_episodes(agent_id="planner", user_id=ann.pk)) == [made[3], made[0]]
    assert ids(service.recent_episodes(agent_id="planner", limit=2)) == [made[5], made[3]]
    assert ids(service.recent_episodes(limit=3)) == [made[5], made[4], made[3]]
    assert ids(service.recent_episodes(agent_id="nobody")) == []


def test_recent_episodes_default_limit_and_ties(service):
    episodes = [service.start_episode(agent_id="planner") for _ in range(7)]
    Episode.objects.update(started_at=timezone.now())  # a tie: newest id first
    assert [e.pk for e in service.recent_episodes(agent_id="planner")] == [e.pk for e in reversed(episodes)][:5]


def test_recent_episodes_bad_arguments(service):
    for kwargs, field in [({"limit": 0}, "limit"), ({"limit": "3"}, "limit"), ({"user_id": "x"}, "user_id")]:
        with pytest.raises(InvalidMemoryArgument) as exc:
            service.recent_episodes(**kwargs)
        assert exc.value.field == field


@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_are_all_kept(service, run_in_threads):
    episode = service.start_episode(agent_id="planner")

    def append(n):
        for i in range(5):
            service.add_message(episode.pk, "user", f"{n}-{i}")
            service.add_action(episode.pk, {"n": n, "i": i})

    run_in_threads(append, 8)
    stored = Episode.objects.get(pk=episode.pk)
    assert sorted(m["content"] for m in stored.conversation) == sorted(f"{n}-{i}" for n in range(8) for i in range(5))
    assert len(stored.actions) == 40
    for n in range(8):  # each thread's own items stay in its order
        assert [m["content"] for m in stored.conversation if m["content"].startswith(f"{n}-")] == [
            f"{n}-{i}" for i in range(5)
        ]


def test_a_run_recorded_long_after_it_started_keeps_the_longest_duration_the_column_holds(service):
    """An imported conversation keeps its own date: its duration is capped, not an overflow (PostgreSQL)."""
    started = datetime.datetime(2023, 5, 8, 13, 56, tzinfo=datetime.UTC)
    episode = service.record_episode(started_at=started, agent_id="bot", conversation=[], success=True)
    episode = Episode.objects.get(pk=episode.pk)
    assert (episode.started_at, episode.duration_ms) == (started, 2**31 - 1)
