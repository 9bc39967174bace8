"""Pins and the memory budget: pinned facts and procedures reach every prompt, marked and first; a recall
node's character budget keeps them and cuts the rest by score, saying what it cut."""

import pytest
from django.contrib.admin.models import LogEntry
from langchain_core.messages import HumanMessage

from memory.exceptions import InvalidMemoryArgument
from memory.models import Fact, Procedure
from workflows.graph.memory_access import LINES
from workflows.graph.nodes import build_recall
from workflows.graph.runs import node_memory
from workflows.language.registry import BuildContext

CTX = BuildContext(workflow_id=1, workflow_slug="helper", node_id="n")


def state(user, text):
    return {"user": {"id": user.pk, "channel": "telegram"}, "messages": [HumanMessage(text)]}


@pytest.fixture
def ada(service, user_factory):
    ada, bob = user_factory("ada"), user_factory("bob")
    for n in range(8):
        service.set_fact(f"tea note {n}", f"tea fact number {n} " + "x" * 40, scope="user", user_id=ada.pk)
    service.set_fact("house rule", "never promise refunds", scope="agent", agent_id="helper")
    service.set_fact("house rule", "refunds within 30 days", scope="global")
    service.set_fact("bob secret", "bob's pin code", scope="user", user_id=bob.pk)
    service.save_procedure("greeting", agent_id="helper", content={"prompt": "Greet by name."})
    service.save_procedure("other agent's", agent_id="other", content={"prompt": "Never shown here."})
    return ada


def test_pinned_memory_reaches_every_prompt_first_and_marked(service, ada):
    rule = Fact.objects.get(key="house rule", scope="agent")
    bobs = Fact.objects.get(key="bob secret")
    greeting = Procedure.objects.get(name="greeting")
    pinned, missing = service.pin_memories("fact", [rule.pk, bobs.pk, 999999])
    assert (pinned, missing) == (sorted([rule.pk, bobs.pk]), [999999])
    service.pin_memories("procedure", [greeting.pk, Procedure.objects.get(agent_id="other").pk])

    result = build_recall({}, CTX)(state(ada, "what about the weather?"))  # matches none of them
    facts = result["memories"]["facts"]
    assert facts[0]["key"] == "house rule" and facts[0]["pinned"] is True and facts[0]["scope"] == "agent"
    assert "bob secret" not in [f["key"] for f in facts]  # a pin shows only to those who see the fact
    prompt = result["memory_prompt"]
    assert "- house rule: never promise refunds (pinned by an operator, agent," in prompt
    assert "[greeting] (pinned) Greet by name." in prompt and "Never shown here" not in prompt
    hits = result["recall_trace"]["hits"]
    assert [h["id"] for h in hits if h.get("pinned")] == [rule.pk, greeting.pk]

    # A pinned global fact shadowed by the agent's own fact of its key stays out; unpinning ends it.
    service.pin_memories("fact", [rule.pk], pinned=False)
    service.pin_memories("fact", [Fact.objects.get(key="house rule", scope="global").pk])
    prompt = build_recall({}, CTX)(state(ada, "what about the weather?"))["memory_prompt"]
    assert "pinned by an operator" not in prompt and "refunds within 30 days" not in prompt


def test_an_inactive_procedure_is_not_pinned_into_the_prompt(service, ada):
    greeting = Procedure.objects.get(name="greeting")
    service.pin_memories("procedure", [greeting.pk])
    service.deactivate_procedure(greeting.pk)
    assert "greeting" not in build_recall({}, CTX)(state(ada, "hello"))["memory_prompt"]


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda s: s.pin_memories("episode", [1]), "kind"),
        (lambda s: s.pin_memories("fact", []), "ids"),
        (lambda s: s.pin_memories("fact", ["x"]), "ids[0]"),
        (lambda s: s.pin_memories("fact", [1], pinned="yes"), "pinned"),
    ],
)
def test_bad_pin_arguments_name_the_field(service, ada, call, field):
    with pytest.raises(InvalidMemoryArgument) as caught:
        call(service)
    assert caught.value.field == field
    assert not Fact.objects.filter(pinned=True).exists()


def test_the_budget_keeps_pins_and_cuts_the_rest_by_score(service, ada):
    rule = Fact.objects.get(key="house rule", scope="agent")
    service.pin_memories("fact", [rule.pk])
    full = build_recall({"memory_types": ["facts"]}, CTX)(state(ada, "tea fact number 3"))
    assert len(full["memories"]["facts"]) == 9 and full["recall_trace"]["cut"] == []
    scored = [f for f in full["memories"]["facts"] if f["score"] is not None]
    best = max(scored, key=lambda f: f["score"])

    pin_line = len(LINES["fact"](full["memories"]["facts"][0]))
    budget = build_recall({"memory_types": ["facts"], "max_memory_chars": pin_line + len(LINES["fact"](best)) + 5}, CTX)
    result = budget(state(ada, "tea fact number 3"))
    kept = result["memories"]["facts"]
    assert [f["key"] for f in kept] == ["house rule", best["key"]]  # the pin, then the best that fits
    cut = result["recall_trace"]["cut"]
    assert len(cut) == 7 and {c["kind"] for c in cut} == {"fact"}
    assert best["id"] not in [c["id"] for c in cut] and rule.pk not in [c["id"] for c in cut]
    assert all(c["chars"] > 0 for c in cut)
    assert node_memory(result)["cut"] == cut  # the run's details show it
    assert result["memory_prompt"].count("- tea note") == 1

    nothing = build_recall({"memory_types": ["facts"], "max_memory_chars": 0}, CTX)(state(ada, "tea fact"))
    assert [f["key"] for f in nothing["memories"]["facts"]] == ["house rule"]


def test_the_budget_setting_applies_when_the_node_sets_none(service, ada, settings):
    found = build_recall({"memory_types": ["facts"]}, CTX)(state(ada, "tea fact"))["memories"]["facts"]
    settings.WORKFLOWS = {**settings.WORKFLOWS, "MAX_MEMORY_CHARS": 10}
    result = build_recall({"memory_types": ["facts"]}, CTX)(state(ada, "tea fact"))
    assert found and result["memories"]["facts"] == []
    assert [c["id"] for c in result["recall_trace"]["cut"]] != [] and len(result["recall_trace"]["cut"]) == len(found)


def test_staff_pin_through_rest_and_the_change_is_logged(api, service, ada):
    rule = Fact.objects.get(key="house rule", scope="agent")
    greeting = Procedure.objects.get(name="greeting")
    response = api.post(f"/api/v1/facts/{rule.pk}/pin/", {"pinned": True}, format="json")
    assert response.status_code == 200 and response.json() == {"pinned": True}
    assert api.get(f"/api/v1/facts/{rule.pk}/").json()["pinned"] is True
    assert api.post(f"/api/v1/procedures/{greeting.pk}/pin/", {"pinned": True}, format="json").status_code == 200
    assert Procedure.objects.get(pk=greeting.pk).pinned
    entry = LogEntry.objects.get(object_id=str(rule.pk), content_type__model="fact")
    assert entry.change_message == "Pinned through the API" and entry.user.is_staff

    bad = api.post(f"/api/v1/facts/{rule.pk}/pin/", {"pinned": "yes"}, format="json")
    assert bad.status_code == 400 and "pinned" in bad.json()
    assert api.post("/api/v1/facts/999999/pin/", {"pinned": True}, format="json").status_code == 404
    api.post(f"/api/v1/facts/{rule.pk}/pin/", {"pinned": False}, format="json")
    assert not Fact.objects.get(pk=rule.pk).pinned


def test_staff_pin_from_the_admin(staff_client, service, ada):
    rule = Fact.objects.get(key="house rule", scope="agent")
    response = staff_client.post(
        "/memories/memory/fact/", {"action": "pin_memories", "_selected_action": [rule.pk]}, follow=True
    )
    assert response.status_code == 200 and "Pinned 1 fact." in response.content.decode()
    assert Fact.objects.get(pk=rule.pk).pinned
    assert LogEntry.objects.filter(object_id=str(rule.pk), change_message="Pinned").exists()
