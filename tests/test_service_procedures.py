"""Procedures through MemoryService: saving, lookup, matching, ranking and usage statistics."""

import pytest

from memory.exceptions import InvalidMemoryArgument, MemoryNotFound
from memory.models import Procedure

pytestmark = pytest.mark.django_db

WEATHER = {"goal_contains": ["Weather", "forecast"]}


def test_save_creates_then_replaces_by_agent_and_name(service):
    first = service.save_procedure(
        "weather_report",
        agent_id="planner",
        description="v1",
        trigger_conditions=WEATHER,
        procedure_type="tool_sequence",
        content={"steps": ["geocode", "fetch"]},
    )
    stored = Procedure.objects.get(pk=first.pk)
    assert stored.trigger_conditions == {"goal_contains": ["weather", "forecast"]}
    assert (stored.description, stored.procedure_type, stored.content) == (
        "v1",
        "tool_sequence",
        {"steps": ["geocode", "fetch"]},
    )
    assert stored.is_active and stored.source == "human"

    service.record_procedure_use(first.pk, success=True)
    second = service.save_procedure(
        "weather_report", agent_id="planner", description="v2", content={"steps": ["fetch"]}
    )
    assert second.pk == first.pk
    stored = Procedure.objects.get(pk=first.pk)
    assert (stored.description, stored.content, stored.trigger_conditions) == ("v2", {"steps": ["fetch"]}, {})
    assert stored.times_used == 1  # replacing the definition keeps its record
    assert Procedure.objects.count() == 1

    shared = service.save_procedure("weather_report", description="shared")
    other = service.save_procedure("weather_report", agent_id="writer", description="writer's")
    assert len({first.pk, shared.pk, other.pk}) == 3
    assert Procedure.objects.count() == 3


def test_get_procedure_prefers_the_agents_own(service):
    shared = service.save_procedure("summarise", description="shared")
    own = service.save_procedure("summarise", agent_id="planner", description="own")
    assert service.get_procedure("summarise", agent_id="planner").pk == own.pk
    assert service.get_procedure("summarise", agent_id="writer").pk == shared.pk
    assert service.get_procedure("summarise").pk == shared.pk
    assert service.get_procedure("missing", agent_id="planner") is None
    only_own = service.save_procedure("draft", agent_id="planner")
    assert service.get_procedure("draft", agent_id="planner").pk == only_own.pk
    assert service.get_procedure("draft", agent_id="writer") is None


@pytest.mark.parametrize(
    "goal, matches",
    [
        ("What's the WEATHER like?", True),
        ("give me the forecast", True),
        ("Forecast for tomorrow's weather", True),
        ("tell me a joke", False),
        ("", False),
    ],
)
def test_find_procedure_goal_contains_any_word(service, goal, matches):
    proc = service.save_procedure("weather_report", trigger_conditions=WEATHER)
    found = service.find_procedure(goal)
    assert (found.pk if found else None) == (proc.pk if matches else None)


@pytest.mark.parametrize(
    "context, matches",
    [
        ({"location": "Porto", "units": "metric"}, True),
        ({"location": "Porto", "units": "metric", "extra": 1}, True),
        ({"location": "Porto"}, False),
        ({}, False),
        (None, False),
    ],
)
def test_find_procedure_context_has_all_keys(service, context, matches):
    proc = service.save_procedure("weather_report", trigger_conditions={"context_has": ["location", "units"]})
    found = service.find_procedure("anything", context)
    assert (found.pk if found else None) == (proc.pk if matches else None)


def test_find_procedure_both_conditions(service):
    proc = service.save_procedure(
        "weather_report", trigger_conditions={"goal_contains": ["weather"], "context_has": ["location"]}
    )
    assert service.find_procedure("weather please", {"location": "Porto"}).pk == proc.pk
    assert service.find_procedure("weather please", {}) is None
    assert service.find_procedure("hello", {"location": "Porto"}) is None


def test_procedure_without_conditions_matches_any_goal(service):
    proc = service.save_procedure("fallback", trigger_conditions={"goal_contains": [], "context_has": []})
    assert service.find_procedure("anything at all").pk == proc.pk


def test_best_success_rate_wins(service):
    a = service.save_procedure("weather_a", trigger_conditions=WEATHER)
    b = service.save_procedure("weather_b", trigger_conditions=WEATHER)
    for _ in range(3):
        service.record_procedure_use(b.pk, success=True)
    service.record_procedure_use(a.pk, success=True)
    service.record_procedure_use(a.pk, success=False)
    assert service.find_procedure("weather today").pk == b.pk
    assert [p.pk for p in service.matching_procedures("weather today")] == [b.pk, a.pk]


def test_untried_ranks_above_failing_and_below_succeeding(service):
    failing = service.save_procedure("a_failing", trigger_conditions=WEATHER)
    untried = service.save_procedure("b_untried", trigger_conditions=WEATHER)
    good = service.save_procedure("c_good", trigger_conditions=WEATHER)
    service.record_procedure_use(failing.pk, success=False)
    assert service.find_procedure("weather").pk == untried.pk
    service.record_procedure_use(good.pk, success=True)
    assert [p.pk for p in service.matching_procedures("weather", limit=3)] == [good.pk, untried.pk, failing.pk]


def test_inactive_procedures_never_match(service):
    proc = service.save_procedure("weather_report", trigger_conditions=WEATHER)
    for _ in range(5):
        service.record_procedure_use(proc.pk, success=True)
    worse = service.save_procedure("weather_backup", trigger_conditions=WEATHER)
    service.deactivate_procedure(proc.pk)
    assert service.find_procedure("weather").pk == worse.pk
    service.deactivate_procedure(worse.pk)
    assert service.find_procedure("weather") is None
    assert service.matching_procedures("weather") == []
    assert {p.pk for p in service.list_procedures()} == {proc.pk, worse.pk}
    assert service.list_procedures(active_only=True) == []
    with pytest.raises(MemoryNotFound):
        service.deactivate_procedure(987654)


def test_another_agents_procedures_never_match(service):
    theirs = service.save_procedure("weather_report", agent_id="writer", trigger_conditions=WEATHER)
    for _ in range(5):
        service.record_procedure_use(theirs.pk, success=True)
    assert service.find_procedure("weather", agent_id="planner") is None
    assert service.find_procedure("weather") is None  # no agent: shared procedures only
    shared = service.save_procedure("weather_shared", trigger_conditions=WEATHER)
    assert service.find_procedure("weather", agent_id="planner").pk == shared.pk
    assert service.find_procedure("weather", agent_id="writer").pk == theirs.pk
    assert {p.pk for p in service.list_procedures(agent_id="planner")} == {shared.pk}


def test_record_procedure_use_statistics(service):
    proc = service.save_procedure("weather_report")
    service.record_procedure_use(proc.pk, success=True, duration_ms=100)
    service.record_procedure_use(proc.pk, success=False, duration_ms=200)
    returned = service.record_procedure_use(proc.pk, success=True, duration_ms=600)
    stored = Procedure.objects.get(pk=proc.pk)
    assert (stored.times_used, stored.times_succeeded, stored.times_failed) == (3, 2, 1)
    assert stored.success_rate == pytest.approx(2 / 3)
    assert stored.avg_duration_ms == 300.0
    assert stored.last_used is not None
    assert (returned.times_used, returned.avg_duration_ms) == (3, 300.0)


def test_record_procedure_use_bad_arguments(service):
    proc = service.save_procedure("weather_report")
    for kwargs, field in [
        ({"success": "yes"}, "success"),
        ({"success": 1}, "success"),
        ({"success": True, "duration_ms": -1}, "duration_ms"),
        ({"success": True, "duration_ms": "5"}, "duration_ms"),
        ({"success": True, "duration_ms": True}, "duration_ms"),
    ]:
        with pytest.raises(InvalidMemoryArgument) as exc:
            service.record_procedure_use(proc.pk, **kwargs)
        assert exc.value.field == field
    stored = Procedure.objects.get(pk=proc.pk)
    assert (stored.times_used, stored.success_rate, stored.avg_duration_ms) == (0, 0.0, 0.0)
    with pytest.raises(MemoryNotFound):
        service.record_procedure_use(987654, success=True)


@pytest.mark.parametrize(
    "conditions",
    [
        "weather",
        ["weather"],
        {"goal": ["weather"]},
        {"goal_contains": "weather"},
        {"goal_contains": [1]},
        {"goal_contains": ["weather", ""]},
        {"context_has": ["  "]},
        {"context_has": {"location": True}},
    ],
    ids=repr,
)
def test_bad_trigger_conditions_are_rejected(service, conditions):
    with pytest.raises(InvalidMemoryArgument) as exc:
        service.save_procedure("weather_report", trigger_conditions=conditions)
    assert exc.value.field == "trigger_conditions"
    assert Procedure.objects.count() == 0


def test_save_procedure_other_bad_arguments(service):
    for kwargs, field in [
        ({"name": ""}, "name"),
        ({"name": "x", "procedure_type": "spell"}, "procedure_type"),
        ({"name": "x", "source": "dream"}, "source"),
        ({"name": "x", "content": {1, 2}}, "content"),
    ]:
        name = kwargs.pop("name")
        with pytest.raises(InvalidMemoryArgument) as exc:
            service.save_procedure(name, **kwargs)
        assert exc.value.field == field
    assert Procedure.objects.count() == 0


def test_find_procedure_bad_arguments(service):
    with pytest.raises(InvalidMemoryArgument) as exc:
        service.find_procedure(None)
    assert exc.value.field == "goal"
    with pytest.raises(InvalidMemoryArgument) as exc:
        service.find_procedure("weather", ["location"])
    assert exc.value.field == "context"


@pytest.mark.django_db(transaction=True)
def test_concurrent_uses_are_all_counted(service, run_in_threads):
    proc = service.save_procedure("weather_report")

    def use(n):
        for _i in range(5):
            service.record_procedure_use(proc.pk, success=n % 2 == 0, duration_ms=100 * (n + 1))

    run_in_threads(use, 8)
    stored = Procedure.objects.get(pk=proc.pk)
    assert (stored.times_used, stored.times_succeeded, stored.times_failed) == (40, 20, 20)
    assert stored.success_rate == pytest.approx(0.5)
    assert stored.avg_duration_ms == pytest.approx(450.0)  # mean of 100..800, five times each


@pytest.mark.django_db(transaction=True)
def test_save_procedure_with_an_unknown_parent(service):
    """A parent id that names no procedure is a bad argument (or a missing row), not a database error."""
    with pytest.raises((InvalidMemoryArgument, MemoryNotFound)) as exc:
        service.save_procedure("weather_v2", parent_id=987654)
    if isinstance(exc.value, InvalidMemoryArgument):
        assert exc.value.field == "parent_id"
    assert Procedure.objects.count() == 0


def test_save_procedure_with_a_parent(service):
    parent = service.save_procedure("weather_v1")
    child = service.save_procedure("weather_v2", parent_id=parent.pk, source="evolved")
    stored = Procedure.objects.get(pk=child.pk)
    assert (stored.parent_id, stored.source) == (parent.pk, "evolved")
