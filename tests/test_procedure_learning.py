"""Procedures that learn: proposed from repeated successful runs, evolved when they fail, never active
until a person approves them (memory/learning/procedure_learning.py)."""

import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone
from langchain_core.messages import HumanMessage

from memory.models import Procedure, ProcedureSource, ProcedureType
from workflows.graph.nodes import build_recall
from workflows.language.registry import BuildContext

CTX = BuildContext(workflow_id=1, workflow_slug="helper", node_id="n")
WEATHER = [{"tool": "geocode", "args": {}}, {"tool": "forecast", "args": {}}, {"tool": "forecast", "args": {}}]


def run(service, message, actions, *, success=True, agent="helper", workflow="weather", error="", days_ago=0):
    return service.record_episode(
        started_at=timezone.now() - timedelta(days=days_ago, seconds=5),
        agent_id=agent,
        workflow=workflow,
        conversation=[{"role": "user", "content": message}, {"role": "assistant", "content": "done"}],
        actions=actions,
        success=success,
        error=error,
    )


def test_repeated_successful_runs_of_one_kind_propose_one_inactive_procedure(service):
    for city in ("Paris", "Oslo", "Lima"):
        run(service, f"what is the weather forecast in {city}?", WEATHER)
    run(service, "weather in Rome?", WEATHER, success=False, error="geocoder down")  # failures do not count
    run(service, "weather in Kyiv?", [{"tool": "forecast"}])  # another kind: seen once

    report = service.consolidate()
    assert report.ok, report.as_dict()
    [proposed] = report.procedures.proposed
    procedure = Procedure.objects.get(pk=proposed["id"])
    assert procedure.name == "learned/weather/geocode_forecast"
    assert (procedure.agent_id, procedure.source, procedure.procedure_type, procedure.is_active) == (
        "helper",
        ProcedureSource.LEARNED,
        ProcedureType.TOOL_SEQUENCE,
        False,
    )
    assert procedure.content["steps"] == ["call geocode", "call forecast"]
    assert len(procedure.content["learned_from"]) == 3
    assert procedure.trigger_conditions == {"goal_contains": ["weather", "forecast"]}
    # Inactive: no run sees it until a person approves it.
    assert service.find_procedure("weather forecast please", agent_id="helper") is None
    Procedure.objects.filter(pk=procedure.pk).update(is_active=True)
    assert service.find_procedure("weather forecast please", agent_id="helper").pk == procedure.pk

    # Proposed once: more runs of the kind, or a rejected proposal, do not bring it back.
    Procedure.objects.filter(pk=procedure.pk).update(is_active=False)
    run(service, "weather forecast in Bern?", WEATHER)
    assert service.consolidate().procedures.proposed == []
    assert Procedure.objects.count() == 1


def test_too_few_or_too_old_runs_propose_nothing(service, settings):
    run(service, "weather in Paris?", WEATHER)
    run(service, "weather in Oslo?", WEATHER)
    run(service, "weather in Lima?", WEATHER, days_ago=40)  # past LOOKBACK_DAYS (30)
    assert service.learn_procedures().proposed == []
    settings.MEMORY = {**settings.MEMORY, "PROCEDURE_LEARNING": {"MIN_EPISODES": 2}}
    assert [p["name"] for p in service.learn_procedures().proposed] == ["learned/weather/geocode_forecast"]


def test_a_failing_procedure_gets_one_inactive_evolved_child(service):
    parent = service.save_procedure(
        "weather",
        agent_id="helper",
        trigger_conditions={"goal_contains": ["weather"]},
        content={"prompt": "Call forecast with the city name."},
    )
    for success in (True, False, False, False, False):
        service.record_procedure_use(parent.pk, success=success)
    for city in ("Paris", "Oslo"):
        run(service, f"weather in {city}?", WEATHER)
    run(service, "weather in Rome?", [{"tool": "forecast"}], success=False, error="unknown city: Rome")
    run(service, "weather in Nice?", [{"tool": "forecast"}], success=False, error="unknown city: Nice")
    run(service, "book a table", [{"tool": "booking"}], success=False, error="no tables")  # not a weather run

    report = service.consolidate()
    assert report.ok, report.as_dict()
    [evolved] = report.procedures.evolved
    child = Procedure.objects.get(pk=evolved["id"])
    assert (child.name, child.parent_id, child.source, child.is_active) == (
        "weather (v2)",
        parent.pk,
        ProcedureSource.EVOLVED,
        False,
    )
    assert child.trigger_conditions == parent.trigger_conditions
    assert child.content["steps"] == ["call geocode", "call forecast"]  # what the successful runs did
    assert child.content["prompt"] == "Call forecast with the city name."
    assert sorted(child.content["avoid"]) == ["unknown city: Nice", "unknown city: Rome"]
    assert "20%" in child.description
    Procedure.objects.filter(pk=parent.pk).update(is_active=True)
    assert service.learn_procedures().evolved == []  # one child per parent

    # Approved, the child replaces its parent; failing in turn, it gets a child of its own.
    Procedure.objects.filter(pk=parent.pk).update(is_active=False)
    Procedure.objects.filter(pk=child.pk).update(is_active=True)
    for _ in range(5):
        service.record_procedure_use(child.pk, success=False)
    [grandchild] = service.learn_procedures().evolved
    assert (grandchild["name"], grandchild["parent_id"]) == ("weather (v3)", child.pk)


def test_a_procedure_doing_well_or_used_little_is_not_evolved(service):
    good = service.save_procedure("good", agent_id="helper")
    young = service.save_procedure("young", agent_id="helper")
    for _ in range(5):
        service.record_procedure_use(good.pk, success=True)
    for _ in range(4):
        service.record_procedure_use(young.pk, success=False)
    assert service.learn_procedures().evolved == []


def test_switched_off_nothing_is_learned(service, settings):
    for city in ("Paris", "Oslo", "Lima"):
        run(service, f"weather in {city}?", WEATHER)
    settings.MEMORY = {**settings.MEMORY, "PROCEDURE_LEARNING": {"ENABLED": False}}
    assert service.consolidate().procedures is None
    assert service.learn_procedures().as_dict() == {"ok": True, "proposed": [], "evolved": [], "errors": []}
    assert not Procedure.objects.exists()


def test_memory_consolidate_reports_what_it_proposed(service, capsys):
    for city in ("Paris", "Oslo", "Lima"):
        run(service, f"weather in {city}?", WEATHER)
    call_command("memory", "consolidate")
    out = capsys.readouterr().out
    assert "procedure proposed (inactive until approved): learned/weather/geocode_forecast" in out
    assert "call geocode, call forecast" in out
    run(service, "weather in Bern?", WEATHER)
    Procedure.objects.all().delete()  # a deleted proposal may come back
    call_command("memory", "consolidate", "--json")
    data = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in data["procedures"]["proposed"]] == ["learned/weather/geocode_forecast"]


@pytest.fixture
def procedures(service):
    # Conditions no message below meets: only the `latest_procedures` option shows them.
    invoices = {"goal_contains": ["invoice"]}
    older = service.save_procedure("older", agent_id="helper", trigger_conditions=invoices, content={"prompt": "old"})
    Procedure.objects.filter(pk=older.pk).update(updated_at=timezone.now() - timedelta(days=1))
    service.save_procedure("newest", agent_id="helper", trigger_conditions=invoices, content={"prompt": "newest one"})
    service.save_procedure("elsewhere", agent_id="other", content={"prompt": "another agent's"})
    service.save_procedure("off", agent_id="helper", content={"prompt": "inactive"}, is_active=False)
    service.save_procedure("weather", trigger_conditions={"goal_contains": ["weather"]}, content={"prompt": "city"})


def state(text):
    return {"messages": [HumanMessage(text)], "user": {}}


def test_the_recall_node_can_always_show_the_latest_procedures(procedures):
    assert build_recall({}, CTX)(state("hello there"))["memories"]["procedures"] == []
    latest = build_recall({"latest_procedures": 2}, CTX)
    result = latest(state("hello there"))
    assert [p["name"] for p in result["memories"]["procedures"]] == ["weather", "newest"]
    assert "[newest] newest one" in result["memory_prompt"]
    # Matching ones come first and are not repeated; an empty message still shows the latest.
    names = [p["name"] for p in latest(state("weather today?"))["memories"]["procedures"]]
    assert names == ["weather", "newest"]
    assert [p["name"] for p in latest(state(""))["memories"]["procedures"]] == ["weather", "newest"]
