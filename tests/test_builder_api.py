"""The builder's API: layout in definitions, versioned saves, validation with locations, streamed runs
(through Django's test client here; under gunicorn and uvicorn in test_builder_stream.py), run records,
what memory each run used and wrote, the memory a run will see, and the /builder/ page."""

import copy
import json

import jsonschema
import pytest

from memory.models import Fact
from memory.service import MemoryService
from workflows.demo import DEMO_DEFINITION
from workflows.exceptions import InvalidDefinition
from workflows.graph.runs import jsonable
from workflows.graph.runtime import run_workflow
from workflows.language.definition import compile_definition, definition_errors, validate_definition
from workflows.models import Workflow, WorkflowRun


def laid_out():
    data = copy.deepcopy(DEMO_DEFINITION)
    for i, node in enumerate(data["nodes"]):
        node["position"] = {"x": 100.5 * i, "y": -20}
        node["label"] = f"Step {i}"
    data["layout"] = {"viewport": {"x": 10, "y": -5.5, "zoom": 0.75}}
    return data


def parse_sse(raw):
    """[(event type, data)] of a text/event-stream body."""
    events = []
    for block in raw.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


# ------------------------------------------------------------------ layout


def test_layout_is_kept_on_save_and_ignored_by_the_compiler(api, db):
    response = api.post(
        "/api/v1/workflows/", {"slug": "laid", "name": "Laid out", "definition": laid_out()}, format="json"
    )
    assert response.status_code == 201, response.content
    saved = api.get("/api/v1/workflows/laid/").json()["definition"]
    assert saved["nodes"][1]["position"] == {"x": 100.5, "y": -20} and saved["nodes"][1]["label"] == "Step 1"
    assert saved["layout"] == {"viewport": {"x": 10, "y": -5.5, "zoom": 0.75}}
    graph = compile_definition(validate_definition(saved), workflow_id=1, workflow_slug="laid")
    assert set(graph.get_graph().nodes) == {"__start__", "__end__", "identify_user", "recall", "agent", "remember"}
    result = run_workflow(
        Workflow.objects.get(slug="laid"), {"type": "chat", "payload": {"user_id": "a", "message": "hi"}}
    )
    assert result.reply


@pytest.mark.parametrize(
    "change, node, field",
    [
        (lambda d: d["nodes"][0].update(position={"x": "left", "y": 0}), "identify_user", "position.x"),
        (lambda d: d["nodes"][0].update(position={"x": 1}), "identify_user", "position"),
        (lambda d: d["nodes"][1].update(label=7), "recall", "label"),
        (lambda d: d["nodes"][1].update(colour="red"), "recall", "colour"),
        (lambda d: d.update(layout={"viewport": {"x": 0, "y": 0, "zoom": 0}}), None, "layout.viewport.zoom"),
        (lambda d: d.update(layout={"viewport": {"x": 0, "y": True, "zoom": 1}}), None, "layout.viewport.y"),
        (lambda d: d.update(layout={"zoom": 1}), None, "layout"),
    ],
)
def test_bad_layout_is_refused_naming_the_field_and_saves_nothing(api, db, change, node, field):
    data = laid_out()
    change(data)
    with pytest.raises(InvalidDefinition) as caught:
        validate_definition(data)
    assert (caught.value.node, caught.value.field) == (node, field)
    response = api.post("/api/v1/workflows/", {"slug": "bad", "name": "Bad", "definition": data}, format="json")
    assert response.status_code == 400 and "definition" in response.json()
    assert field in json.dumps(response.json())
    assert not Workflow.objects.exists()


# ------------------------------------------------------------------ versions


def test_saves_carry_the_version_and_a_stale_save_is_a_409_that_changes_nothing(api, demo_workflow):
    got = api.get("/api/v1/workflows/demo/")
    assert got["ETag"] == '"1"' and got.json()["version"] == 1
    mine = got.json()
    mine["name"] = "Mine"
    saved = api.put("/api/v1/workflows/demo/", mine, format="json", HTTP_IF_MATCH='"1"')
    assert saved.status_code == 200, saved.content
    assert saved["ETag"] == '"2"' and saved.json()["version"] == 2 and saved.json()["name"] == "Mine"

    theirs = {**mine, "name": "Theirs"}
    stale = api.put("/api/v1/workflows/demo/", theirs, format="json", HTTP_IF_MATCH='"1"')
    assert stale.status_code == 409
    body = stale.json()
    assert "saved since" in body["detail"]
    assert body["current"] == api.get("/api/v1/workflows/demo/").json()  # as GET returns it
    assert body["current"]["name"] == "Mine" and body["current"]["version"] == 2
    assert Workflow.objects.get(slug="demo").name == "Mine"

    patched = api.patch("/api/v1/workflows/demo/", {"name": "Patched"}, format="json", HTTP_IF_MATCH='W/"2"')
    assert patched.status_code == 200 and patched["ETag"] == '"3"'
    assert api.patch("/api/v1/workflows/demo/", {"name": "x"}, format="json", HTTP_IF_MATCH='"2"').status_code == 409

    # API clients that send no If-Match save as before (and the version still counts the save).
    blind = api.patch("/api/v1/workflows/demo/", {"description": "blind"}, format="json")
    assert blind.status_code == 200 and blind.json()["version"] == 4


def test_a_malformed_if_match_is_a_400_naming_it(api, demo_workflow):
    response = api.patch("/api/v1/workflows/demo/", {"name": "x"}, format="json", HTTP_IF_MATCH="yesterday")
    assert response.status_code == 400 and "If-Match" in response.json()
    assert Workflow.objects.get(slug="demo").version == 1


def test_saves_outside_the_api_count_too(demo_workflow):
    demo_workflow.name = "Renamed in the admin"
    demo_workflow.save()
    assert demo_workflow.version == 2 and Workflow.objects.get(pk=demo_workflow.pk).version == 2


# ------------------------------------------------------------------ validation


def validate(api, definition):
    response = api.post("/api/v1/workflows/validate/", {"definition": definition}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def test_validate_answers_valid_for_a_good_definition(api, db):
    assert validate(api, laid_out()) == {"valid": True, "errors": []}
    assert not Workflow.objects.exists()


def test_validate_locates_every_problem_by_node_edge_and_field(api, db):
    data = laid_out()
    data["nodes"][1]["config"] = {"limit": 0, "min_confidence": 2}
    data["nodes"][3]["position"] = {"x": None, "y": 0}
    data["edges"].append({"source": "agent", "target": "ghost"})
    answer = validate(api, data)
    assert answer["valid"] is False
    located = {(e["node"], e["edge"], e["field"]) for e in answer["errors"]}
    assert located == {
        ("recall", None, "config.limit"),
        ("recall", None, "config.min_confidence"),
        ("remember", None, "position.x"),
        ("agent", 5, "target"),
    }
    assert all(e["message"] for e in answer["errors"])


def test_validate_reports_the_graph_shape_once_its_parts_are_sound(api, db):
    data = laid_out()
    data["edges"] = [e for e in data["edges"] if e["target"] != "remember"]
    (error,) = validate(api, data)["errors"]
    assert error["node"] == "remember" and "not reachable" in error["message"]


def test_validate_needs_a_definition(api, db):
    response = api.post("/api/v1/workflows/validate/", {"nodes": []}, format="json")
    assert response.status_code == 400 and "definition" in response.json()


@pytest.mark.parametrize("definition", ["", None, [], 3])
def test_validate_refuses_a_definition_that_is_not_an_object_naming_the_field(api, db, definition):
    """The schema declares the definition a JSON object: anything else is a 400, not a 200 {"valid": false}."""
    response = api.post("/api/v1/workflows/validate/", {"definition": definition}, format="json")
    assert response.status_code == 400 and "definition" in response.json()


def test_definition_errors_and_validate_definition_agree(db):
    data = laid_out()
    data["nodes"][1]["config"] = {"limit": 0}
    errors = definition_errors(data)
    with pytest.raises(InvalidDefinition) as caught:
        validate_definition(data)
    assert str(caught.value) == str(errors[0]) and 'node "recall": config.limit' in str(caught.value)


# ------------------------------------------------------------------ streamed runs


def stream(client, slug="demo", **body):
    body = {"message": "my name is Ada", "channel": "telegram", "external_id": "42", **body}
    return client.post(f"/api/v1/workflows/{slug}/runs/stream/", body, format="json", HTTP_ACCEPT="text/event-stream")


def test_stream_sends_each_node_and_the_run_as_events_and_keeps_the_run(api, demo_workflow):
    response = stream(api, display_name="Ada")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/event-stream")
    assert response["Cache-Control"] == "no-cache" and response["X-Accel-Buffering"] == "no"
    events = parse_sse(b"".join(response.streaming_content).decode())
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    started = [d["node"] for k, d in events if k == "node_started"]
    finished = [d["node"] for k, d in events if k == "node_finished"]
    assert started == finished == ["identify_user", "recall", "agent", "remember"]
    first = events[0][1]
    run = WorkflowRun.objects.get(pk=first["run_id"])
    assert first["workflow_version"] == 1 and first["started_at"]
    identify = next(d for k, d in events if k == "node_started" and d["node"] == "identify_user")
    assert identify["input"]["trigger"]["payload"]["message"] == "my name is Ada"
    assert identify["input"]["messages"][0] == {"type": "human", "content": "my name is Ada"}
    ident_out = next(d for k, d in events if k == "node_finished" and d["node"] == "identify_user")
    assert ident_out["output"]["user"]["external_id"] == "42" and ident_out["duration_ms"] >= 0
    end = events[-1][1]
    assert end["status"] == "succeeded" and end["errors"] == [] and "Ada" in end["reply"]
    assert end["run_id"] == run.pk

    # The record: who, what, every event as sent.
    run.refresh_from_db()
    assert run.status == "succeeded" and run.trigger == "manual" and run.reply == end["reply"]
    assert run.user.canonical_id == "telegram:42" and run.thread_id.startswith(f"{run.user_id}:direct:")
    assert [e["event"] for e in run.events] == kinds and run.duration_ms > 0 and run.finished_at
    assert run.input["message"] == "my name is Ada" and run.workflow_version == 1


def test_every_streamed_event_is_what_the_openapi_schema_declares(api, demo_workflow):
    """Clients generated from /api/schema/ read each event as its fields: a known `event` and `data`
    holding a JSON object (the declared schema of the stream's items)."""
    document = api.get("/api/schema/?format=json").json()
    operation = document["paths"]["/api/v1/workflows/{slug}/runs/stream/"]["post"]
    declared = operation["responses"]["200"]["content"]["text/event-stream"]["schema"]
    raw = b"".join(stream(api, external_id=42).streaming_content).decode()
    blocks = [dict(line.split(": ", 1) for line in block.splitlines()) for block in raw.strip().split("\n\n")]
    assert [b["event"] for b in blocks][:: len(blocks) - 1] == ["run_started", "run_finished"]
    for block in blocks:
        jsonschema.validate(block, declared)
        assert isinstance(json.loads(block["data"]), dict)


def test_recall_and_remember_events_show_what_memory_was_used_and_written(api, demo_workflow):
    MemoryService().set_fact("name", "Nobody", scope="global")
    events = parse_sse(b"".join(stream(api).streaming_content).decode())
    remember = next(d for k, d in events if k == "node_finished" and d["node"] == "remember")
    writes = remember["memory"]["writes"]
    fact = Fact.objects.get(key="name", scope="user")
    assert {"kind": "fact", "action": "created", "id": fact.pk, "key": "name"}.items() <= next(
        w for w in writes if w["kind"] == "fact"
    ).items()
    assert next(w for w in writes if w["kind"] == "fact")["admin_url"] == f"/memories/memory/fact/{fact.pk}/change/"
    episode = next(w for w in writes if w["kind"] == "episode")
    assert episode["action"] == "created" and episode["admin_url"].endswith(f"/episode/{episode['id']}/change/")

    events = parse_sse(b"".join(stream(api, message="what is my name?").streaming_content).decode())
    recall = next(d for k, d in events if k == "node_finished" and d["node"] == "recall")["memory"]
    # The user's own "name" hides the global one: the user scope won for that key.
    assert recall["scopes"] == {"name": "user"}
    hits = {(h["kind"], h.get("key")): h for h in recall["hits"]}
    assert hits[("fact", "name")]["text"] == "name: Ada" and hits[("fact", "name")]["score"] > 0
    assert any(kind == "episode" for kind, _ in hits)
    again = next(d for k, d in events if k == "node_finished" and d["node"] == "remember")["memory"]["writes"]
    assert [w["kind"] for w in again] == ["episode"]  # nothing new to store: only the run's episode
    assert "Ada" in events[-1][1]["reply"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"message": ""}, "message"),
        ({"message": 5}, "message"),
        ({"channel": None}, "channel"),
        ({"external_id": True}, "external_id"),
        ({"external_id": " "}, "external_id"),
        ({"external_id": " " * 250 + "42" + " " * 10}, "external_id"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_stream_refuses_bad_input_naming_the_field_and_runs_nothing(api, demo_workflow, body, field):
    response = stream(api, **body)
    assert response.status_code == 400 and response["Content-Type"] == "application/json"
    assert field in response.json()
    assert not WorkflowRun.objects.exists()


def test_stream_is_staff_only_and_404_for_an_unknown_workflow(client, api, demo_workflow):
    assert stream(client).status_code in (401, 403)
    assert stream(api, slug="nope").status_code == 404
    assert not WorkflowRun.objects.exists()


def test_a_failing_node_is_a_node_error_and_a_failed_run(api, demo_workflow, settings):
    settings.WORKFLOWS = {**settings.WORKFLOWS, "CHAT_MODEL": {"class": "tests.test_builder_api.Broken"}}
    events = parse_sse(b"".join(stream(api).streaming_content).decode())
    error = next(d for k, d in events if k == "node_error")
    assert error["node"] == "agent" and "model unavailable" in error["error"]
    end = events[-1][1]
    assert end["status"] == "failed" and any("model unavailable" in e["error"] for e in end["errors"])
    assert WorkflowRun.objects.get(pk=end["run_id"]).status == "failed"


class Broken:
    """A chat model setting that cannot answer (its construction fails at the first turn)."""

    def __init__(self, **kwargs):
        raise RuntimeError("model unavailable")


# ------------------------------------------------------------------ run records


def test_the_run_endpoint_records_runs_too(api, demo_workflow):
    body = api.post("/api/v1/workflows/demo/run/", {"user_id": "u1", "message": "hi"}, format="json").json()
    run = WorkflowRun.objects.get(pk=body["run_id"])
    assert run.trigger == "chat" and run.status == "succeeded" and run.reply == body["reply"]


def test_a_runs_record_keeps_its_text_and_replaces_only_what_no_column_keeps(demo_workflow):
    text = "hi \U0001f600, a backslash: \\u0000 \\ud800"  # an astral character, and escapes as plain text
    result = run_workflow(demo_workflow, {"type": "chat", "payload": {"user_id": "u1", "message": text}})
    run = WorkflowRun.objects.get(pk=result.run_id)
    assert run.input["message"] == text
    started = next(e for e in run.events if e["event"] == "node_started")
    assert started["data"]["input"]["messages"][0]["content"] == text
    # What a model or a node wrote reaches the record with a NUL or a lone surrogate replaced (keys too).
    assert jsonable({"k\x00": ["a\ud800b", ("t", 1)], "e": "\U0001f600"}) == {
        "k\ufffd": ["a\ufffdb", ["t", 1]],
        "e": "\U0001f600",
    }


def test_runs_are_listed_per_workflow_retrieved_and_deleted(api, demo_workflow, django_assert_max_num_queries):
    other = Workflow.objects.create(slug="other", name="Other", definition=DEMO_DEFINITION)
    for text in ("one", "two"):
        run_workflow(demo_workflow, {"type": "chat", "payload": {"user_id": "u1", "message": text}})
    run_workflow(other, {"type": "chat", "payload": {"user_id": "u1", "message": "three"}})
    with django_assert_max_num_queries(3):  # token, count, page (workflow joined)
        listed = api.get("/api/v1/runs/", {"workflow": "demo"}).json()
    assert listed["count"] == 2 and [r["workflow"] for r in listed["results"]] == ["demo", "demo"]
    assert "events" not in listed["results"][0]
    newest = listed["results"][0]
    detail = api.get(f"/api/v1/runs/{newest['id']}/").json()
    assert detail["input"]["message"] == "two" and detail["events"][-1]["event"] == "run_finished"
    assert api.get("/api/v1/runs/", {"colour": "red"}).status_code == 400

    assert api.delete(f"/api/v1/runs/{newest['id']}/").status_code == 204
    ids = list(WorkflowRun.objects.values_list("pk", flat=True))
    answer = api.post("/api/v1/runs/batch-delete/", {"ids": [*ids, 999999]}, format="json").json()
    assert answer == {"deleted": 2, "not_found": [999999]}
    assert api.post("/api/v1/runs/batch-delete/", {"ids": ["x"]}, format="json").status_code == 400
    assert not WorkflowRun.objects.exists()


def test_the_schema_lists_the_builder_endpoints(api, db):
    paths = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()["paths"]
    for path in (
        "/api/v1/runs/",
        "/api/v1/runs/{id}/",
        "/api/v1/runs/batch-delete/",
        "/api/v1/workflows/validate/",
        "/api/v1/workflows/{slug}/runs/stream/",
        "/api/v1/workflows/{slug}/memory-view/",
    ):
        assert path in paths, path


def test_forgetting_a_person_deletes_their_runs_and_verify_erasure_finds_none(demo_workflow):
    service = MemoryService()
    run_workflow(demo_workflow, {"type": "chat", "payload": {"user_id": "zed", "message": "my name is Zebedee"}})
    kept = run_workflow(demo_workflow, {"type": "chat", "payload": {"user_id": "amy", "message": "hello"}})
    zed = service.find_user("chat", "zed")
    assert WorkflowRun.objects.filter(user=zed).count() == 1
    assert service.user_footprint([zed.pk]).get("workflow runs") == 1
    service.delete_users([zed.pk], cascade=True)
    assert not WorkflowRun.objects.filter(external_id="zed").exists()
    assert WorkflowRun.objects.filter(pk=kept.run_id).exists()
    from memory.operations.erasure import find_traces

    left = [where for where, _ in find_traces(["Zebedee", "zed"], [zed.pk]) if WorkflowRun._meta.db_table in where]
    assert left == []


def test_runs_that_identified_nobody_go_with_the_identity_they_came_from(demo_workflow, settings):
    service = MemoryService()
    zed, _ = service.get_or_create_user("chat", "zed")
    # A run of theirs that identified nobody (a workflow without identify_user).
    blind = Workflow.objects.create(
        slug="blind",
        name="Blind",
        definition={
            "nodes": [{"id": "recall", "type": "recall"}],
            "edges": [{"source": "START", "target": "recall"}],
        },
    )
    run = run_workflow(blind, {"type": "chat", "payload": {"user_id": "zed", "message": "my secret"}})
    assert WorkflowRun.objects.get(pk=run.run_id).user_id is None
    service.delete_users([zed.pk], cascade=True)
    assert not WorkflowRun.objects.filter(pk=run.run_id).exists()


# ------------------------------------------------------------------ memory view


def test_memory_view_shows_the_persons_memory_as_the_next_run_sees_it(api, demo_workflow):
    service = MemoryService()
    parse_sse(b"".join(stream(api).streaming_content).decode())
    service.set_fact("office_hours", "9 to 5", scope="agent", agent_id="demo")
    service.set_fact("office_hours", "never", scope="agent", agent_id="someone-else")
    service.set_fact("name", "Nobody", scope="global")
    service.save_procedure("greet", description="greet by name", agent_id="demo")
    view = api.get("/api/v1/workflows/demo/memory-view/", {"channel": "telegram", "external_id": "42"})
    assert view.status_code == 200, view.content
    body = view.json()
    assert body["user"]["canonical_id"] == "telegram:42"
    assert [(f["key"], f["value"]) for f in body["facts"]["user"]] == [("name", "Ada")]
    assert [(f["key"], f["value"]) for f in body["facts"]["agent"]] == [("office_hours", "9 to 5")]
    assert body["facts"]["global"] == []  # the user's "name" hides the global one
    fact = body["facts"]["user"][0]
    assert fact["admin_url"] == f"/memories/memory/fact/{fact['id']}/change/"
    assert len(body["episodes"]) == 1 and body["episodes"][0]["admin_url"]
    assert [p["name"] for p in body["procedures"]] == ["greet"]


def test_memory_view_of_an_unknown_person_creates_nobody(api, demo_workflow):
    body = api.get("/api/v1/workflows/demo/memory-view/", {"channel": "telegram", "external_id": "7"}).json()
    assert body["user"] is None and body["episodes"] == [] and body["facts"]["user"] == []
    assert MemoryService().find_user("telegram", "7") is None
    bad = api.get("/api/v1/workflows/demo/memory-view/", {"channel": "telegram"})
    assert bad.status_code == 400 and "external_id" in bad.json()


# ------------------------------------------------------------------ the builder page


@pytest.fixture
def built(tmp_path, settings):
    """A built frontend among the static files (what `npm run build` writes)."""
    build = tmp_path / "static" / "workflows" / "builder"
    (build / "assets").mkdir(parents=True)
    (build / "index.html").write_text(
        '<!doctype html><html><head><script type="module" src="/static/workflows/builder/assets/app.js"></script>'
        "</head><body><div id=root></div></body></html>"
    )
    (build / "assets" / "app.js").write_text("console.log('builder')")
    settings.STATICFILES_DIRS = [str(tmp_path / "static")]
    return build


def test_builder_page_serves_the_build_to_staff_with_a_csrf_token(staff_client, built):
    response = staff_client.get("/builder/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "<div id=root>" in html and 'src="/static/workflows/builder/assets/app.js"' in html
    assert '<meta name="csrf-token" content="' in html and "csrftoken" in response.cookies
    assert staff_client.get("/builder/workflows/demo").status_code == 200  # a deep link reloaded


def test_builder_assets_follow_the_static_url(staff_client, built, settings):
    settings.STATIC_URL = "/assets-here/"
    html = staff_client.get("/builder/").content.decode()
    assert 'src="/assets-here/workflows/builder/assets/app.js"' in html


def test_builder_page_sends_others_to_the_login(client, db):
    response = client.get("/builder/")
    assert response.status_code == 302 and response["Location"].startswith("/memories/login/?next=/builder/")


def test_a_missing_build_is_a_503_saying_how_to_build(staff_client, settings, tmp_path):
    settings.STATICFILES_DIRS = []
    from workflows.builder import api as builder

    if builder.builder_index_path() is not None:
        pytest.skip("the frontend is built in this checkout")
    response = staff_client.get("/builder/")
    assert response.status_code == 503 and b"npm ci" in response.content and b"npm run build" in response.content


def test_home_leads_staff_to_the_builder_and_others_to_the_login(client, staff, db):
    anonymous = client.get("/")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/memories/login/?next=/builder/")
    client.force_login(staff)
    assert client.get("/")["Location"] == "/builder/"
