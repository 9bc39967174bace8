"""Runs over the staff API and the run_workflow command; bad input names the field and runs nothing."""

import json

import pytest
from django.core.management import CommandError, call_command

from memory.models import Episode, MemoryUser


def run(client, slug, payload):
    return client.post(f"/api/v1/workflows/{slug}/run/", payload, content_type="application/json")


def test_run_endpoint_runs_the_workflow(admin_client, demo_workflow):
    first = run(
        admin_client, "demo", {"user_id": "u1", "message": "my favourite colour is green", "display_name": "Ann"}
    )
    assert first.status_code == 200, first.content
    body = first.json()
    assert body["remembered"] == [{"key": "favourite_colour", "scope": "user", "action": "created"}]
    assert body["user"]["channel"] == "chat" and body["user"]["display_name"] == "Ann" and body["memory_errors"] == []
    again = run(admin_client, "demo", {"user_id": "u1", "message": "what is my favourite colour?"}).json()
    assert "green" in again["reply"]
    assert Episode.objects.get(pk=again["episode_id"]).trigger_type == "chat"


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"message": "hi"}, "user_id"),
        ({"email": "not-an-address", "message": "hi"}, "email"),
        ({"user_id": "u1", "message": 5}, "message"),
        ({"user_id": "u1", "message": "hi", "trigger": "telegram"}, "trigger"),
    ],
)
def test_run_endpoint_bad_payload_is_400_and_nothing_runs(admin_client, demo_workflow, payload, field):
    response = run(admin_client, "demo", payload)
    assert response.status_code == 400 and field in response.json()
    assert not MemoryUser.objects.exists() and not Episode.objects.exists()


def test_run_endpoint_is_staff_only_and_404_for_unknown(client, admin_client, demo_workflow):
    assert (
        run(client, "demo", {"user_id": "u1", "message": "hi"}).status_code == 401
    )  # anonymous: token auth answers first
    assert run(admin_client, "nope", {"user_id": "u1", "message": "hi"}).status_code == 404


def test_workflow_list_queries(admin_client, demo_workflow, django_assert_max_num_queries):
    admin_client.get("/api/v1/workflows/")
    with django_assert_max_num_queries(4):  # session, user, count, workflows
        response = admin_client.get("/api/v1/workflows/")
    assert response.json()["count"] == 1
    assert [w["slug"] for w in response.json()["results"]] == ["demo"]


def test_run_workflow_command(demo_workflow, capsys):
    call_command("run_workflow", "demo", "--user", "telegram:42", "--message", "my name is Ada")
    call_command("run_workflow", "demo", "--user", "telegram:42", "--message", "what is my name?", "--json")
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{") :])
    assert "Ada" in result["reply"] and result["user"]["canonical_id"] == "telegram:42"
    with pytest.raises(CommandError, match="no active workflow"):
        call_command("run_workflow", "missing", "--user", "x", "--message", "hi")


def test_setup_demo_keeps_an_edited_demo_unless_reset(db, capsys):
    from workflows.models import Workflow

    call_command("setup_demo")
    demo = Workflow.objects.get(slug="demo")
    demo.name = "my edit"
    demo.save()
    call_command("setup_demo")
    assert Workflow.objects.get().name == "my edit"
    call_command("setup_demo", "--reset")
    assert Workflow.objects.get().name != "my edit"
    out = capsys.readouterr().out
    assert "created workflow 'demo'" in out and "kept the existing workflow 'demo'" in out and "restored" in out


def test_workflows_can_be_created_and_edited_with_definitions_checked(admin_client, db):
    from workflows.demo import DEMO_DEFINITION
    from workflows.models import Workflow

    created = admin_client.post(
        "/api/v1/workflows/",
        {"slug": "helper", "name": "Helper", "definition": DEMO_DEFINITION},
        content_type="application/json",
    )
    assert created.status_code == 201, created.content
    bad = {
        **DEMO_DEFINITION,
        "nodes": [
            *DEMO_DEFINITION["nodes"][:-1],
            {"id": "remember", "type": "remember", "config": {"scope": "planet"}},
        ],
    }
    refused = admin_client.patch("/api/v1/workflows/helper/", {"definition": bad}, content_type="application/json")
    assert refused.status_code == 400
    assert refused.json()["definition"][0].startswith('node "remember": config.scope:')
    assert Workflow.objects.get(slug="helper").definition == DEMO_DEFINITION  # nothing changed
    ran = run(admin_client, "helper", {"user_id": "u1", "message": "hello"})
    assert ran.status_code == 200 and ran.json()["workflow"] == "helper"
    assert admin_client.delete("/api/v1/workflows/helper/").status_code == 204
    assert not Workflow.objects.exists()
