"""The `checkpoints` API: threads' checkpoints listed, inspected and deleted through the saver's public API."""

import json

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from memory.conf import memory_settings
from memory.models import ChannelIdentity, Episode, Fact, MemoryUser
from tests.workflow_helpers import saved, talk
from workflows.conversations.checkpointer import get_checkpointer
from workflows.models import Thread

pytestmark = pytest.mark.django_db


def config(thread_id, checkpoint_id=None):
    configurable = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def thread_ids(response):
    return [row["thread_id"] for row in response.json()["results"]]


# ------------------------------------------------------------------ who may use it


def test_anonymous_and_non_staff_are_refused_and_nothing_is_deleted(
    threads, django_user_model, django_capture_on_commit_callbacks
):
    anonymous = APIClient()
    visitor = APIClient()
    user = django_user_model.objects.create_user("visitor")
    visitor.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    ann = threads["ann"]
    with django_capture_on_commit_callbacks(execute=True):
        for client, status in [(anonymous, 401), (visitor, 403)]:
            for method, path, body in [
                ("get", "/api/v1/checkpoints/", None),
                ("get", f"/api/v1/checkpoints/{ann}/", None),
                ("delete", f"/api/v1/checkpoints/{ann}/", None),
                ("post", "/api/v1/checkpoints/batch-delete/", {"ids": [ann]}),
            ]:
                response = getattr(client, method)(path, body, format="json")
                assert response.status_code == status, (method, path, response.content)
    assert Thread.objects.filter(thread_id=ann).exists() and saved(ann)


# ------------------------------------------------------------------ list


def test_list_has_a_total_count_filters_and_ordering(api, threads, demo_workflow):
    ann = MemoryUser.objects.get(canonical_id="chat:ann")
    body = api.get("/api/v1/checkpoints/").json()
    assert body["count"] == 2
    assert thread_ids(api.get("/api/v1/checkpoints/")) == [threads["bob"], threads["ann"]]  # latest activity first
    row = next(r for r in body["results"] if r["thread_id"] == threads["ann"])
    assert row["user"] == ann.pk and row["workflow"] == "demo" and row["conversation_id"] == "direct"
    # Every checkpoint of Ann's runs is counted, the newest is the head.
    assert row["checkpoint_count"] == len(saved(threads["ann"])) > 2
    assert row["head_checkpoint_id"] == saved(threads["ann"])[0].config["configurable"]["checkpoint_id"]

    assert thread_ids(api.get("/api/v1/checkpoints/", {"user": ann.pk})) == [threads["ann"]]
    assert thread_ids(api.get("/api/v1/checkpoints/", {"thread": threads["bob"]})) == [threads["bob"]]
    assert thread_ids(api.get("/api/v1/checkpoints/", {"workflow": "other"})) == []
    assert thread_ids(api.get("/api/v1/checkpoints/", {"ordering": "-checkpoint_count"})) == [
        threads["ann"],
        threads["bob"],
    ]
    page = api.get("/api/v1/checkpoints/", {"page_size": 1, "ordering": "thread_id"}).json()
    assert page["count"] == 2 and len(page["results"]) == 1 and page["next"] is not None


@pytest.mark.parametrize(
    "params,field", [({"user": "ann"}, "user"), ({"user": "0"}, "user"), ({"page_size": "x"}, "page_size")]
)
def test_malformed_list_filters_are_refused(api, threads, params, field):
    response = api.get("/api/v1/checkpoints/", params)
    assert response.status_code == 400 and field in response.json()


def test_list_query_count_does_not_grow_with_threads(api, demo_workflow, capture_data_queries):
    api.get("/api/v1/checkpoints/")  # warm up (token lookups and the like are not what is measured)
    for n in range(2):
        talk(demo_workflow, f"small-{n}")
    with capture_data_queries() as small:
        assert api.get("/api/v1/checkpoints/").status_code == 200
    for n in range(12):
        talk(demo_workflow, f"large-{n}")
    with capture_data_queries() as large:
        response = api.get("/api/v1/checkpoints/")
    assert response.json()["count"] == 14
    assert len(small.data) == len(large.data) == 3, large.data  # token, count, page (workflow joined)


# ------------------------------------------------------------------ one thread's checkpoints


def test_retrieve_lists_the_threads_checkpoints_newest_first(api, threads):
    thread_id = threads["ann"]
    in_saver = saved(thread_id)
    body = api.get(f"/api/v1/checkpoints/{thread_id}/").json()
    assert body["thread_id"] == thread_id and body["more"] is False
    checkpoints = body["checkpoints"]
    assert [c["checkpoint_id"] for c in checkpoints] == [c.config["configurable"]["checkpoint_id"] for c in in_saver]
    head, first = checkpoints[0], checkpoints[-1]
    assert head["parent_checkpoint_id"] == checkpoints[1]["checkpoint_id"]
    assert first["parent_checkpoint_id"] is None and first["source"] in {"input", "loop"}
    assert head["message_count"] == 8  # four messages, four answers
    assert head["blob_size"] > first["blob_size"] > 0  # the conversation grew
    assert {c["source"] for c in checkpoints} <= {"input", "loop", "update", "fork"}


def test_retrieve_pages_with_limit_and_before(api, threads):
    thread_id = threads["ann"]
    everything = [c["checkpoint_id"] for c in api.get(f"/api/v1/checkpoints/{thread_id}/").json()["checkpoints"]]
    first = api.get(f"/api/v1/checkpoints/{thread_id}/", {"limit": 2}).json()
    assert [c["checkpoint_id"] for c in first["checkpoints"]] == everything[:2] and first["more"] is True
    rest = api.get(f"/api/v1/checkpoints/{thread_id}/", {"before": everything[1], "limit": 500}).json()
    assert [c["checkpoint_id"] for c in rest["checkpoints"]] == everything[2:] and rest["more"] is False


@pytest.mark.parametrize(
    "params,field",
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"before": "not an id"}, "before"),
    ],
)
def test_retrieve_refuses_a_malformed_page(api, threads, params, field):
    response = api.get(f"/api/v1/checkpoints/{threads['ann']}/", params)
    assert response.status_code == 400 and field in response.json()


def test_unknown_or_malformed_thread_ids_are_a_json_404(api, threads):
    for ident in ["no:such:thread", "x" * 400, "a%00b"]:
        response = api.get(f"/api/v1/checkpoints/{ident}/")
        assert response.status_code == 404, ident
        assert response["Content-Type"] == "application/json"


# ------------------------------------------------------------------ deletes


def test_delete_one_thread_removes_its_checkpoints(api, threads, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        assert api.delete(f"/api/v1/checkpoints/{threads['ann']}/").status_code == 204
    assert saved(threads["ann"]) == [] and not Thread.objects.filter(thread_id=threads["ann"]).exists()
    assert saved(threads["bob"])
    assert api.delete(f"/api/v1/checkpoints/{threads['ann']}/").status_code == 404


def test_batch_delete_happy_path_and_unknown_ids(api, threads, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/v1/checkpoints/batch-delete/", {"ids": [threads["ann"], "9:direct:9"]}, format="json")
    assert response.status_code == 200
    assert response.json() == {"deleted": 1, "not_found": ["9:direct:9"]}
    assert saved(threads["ann"]) == [] and saved(threads["bob"])
    assert list(Thread.objects.values_list("thread_id", flat=True)) == [threads["bob"]]


def test_batch_delete_removes_checkpoints_no_row_tracks(api, threads, django_capture_on_commit_callbacks):
    orphan = threads["bob"]
    Thread.objects.filter(thread_id=orphan).update(thread_id="renamed")  # the saver still holds bob's thread
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/v1/checkpoints/batch-delete/", {"ids": [orphan]}, format="json")
    assert response.json() == {"deleted": 1, "not_found": []}
    assert saved(orphan) == []


@pytest.mark.parametrize(
    "body",
    [
        {"ids": [12]},
        {"ids": [None]},
        {"ids": [""]},
        {"ids": ["x" * 301]},
        {"ids": ["a\x00b"]},
        {"ids": "1:direct:1"},
        {"ids": []},
        {"ids": {"a": "b"}},
        {},
    ],
)
def test_batch_delete_refuses_malformed_ids(api, threads, body):
    response = api.post("/api/v1/checkpoints/batch-delete/", body, format="json")
    assert response.status_code == 400 and "ids" in response.json()
    assert Thread.objects.count() == 2 and saved(threads["ann"])


def test_valid_and_malformed_ids_mixed_delete_nothing(api, threads, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(
            "/api/v1/checkpoints/batch-delete/", {"ids": [threads["ann"], threads["bob"], 7]}, format="json"
        )
    assert response.status_code == 400
    assert response.json()["ids"] == {"2": ["Must be a thread id (a JSON string), got int."]}
    assert Thread.objects.count() == 2 and saved(threads["ann"]) and saved(threads["bob"])


def test_batch_delete_over_the_limit_is_refused(api, threads, django_capture_on_commit_callbacks):
    limit = memory_settings.API_MAX_BATCH_IDS
    too_many = [threads["ann"]] + [f"{n}:no-such-chat:1" for n in range(limit)]
    response = api.post("/api/v1/checkpoints/batch-delete/", {"ids": too_many}, format="json")
    assert response.status_code == 400 and "ids" in response.json()
    assert saved(threads["ann"])
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/v1/checkpoints/batch-delete/", {"ids": too_many[:limit]}, format="json")
    assert response.status_code == 200
    assert response.json()["deleted"] == 1 and len(response.json()["not_found"]) == limit - 1
    assert saved(threads["ann"]) == []


def test_schema_documents_the_checkpoints_endpoints(api):
    paths = json.loads(api.get("/api/schema/", {"format": "json"}).content)["paths"]
    batch = paths["/api/v1/checkpoints/batch-delete/"]["post"]
    body = batch["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert body.endswith("/ThreadBatchDelete") and {"200", "400", "401", "403", "413", "415"} <= set(batch["responses"])
    detail = paths["/api/v1/checkpoints/{thread_id}/"]
    assert {"get", "delete"} <= set(detail)
    assert {p["name"] for p in detail["get"]["parameters"]} == {"thread_id", "limit", "before"}
    assert {"thread", "user", "workflow", "ordering", "page"} <= {
        p["name"] for p in paths["/api/v1/checkpoints/"]["get"]["parameters"]
    }


# ------------------------------------------------------------------ forget this person


def test_forgetting_a_person_leaves_no_checkpoint_or_write_of_theirs(
    api, service, threads, demo_workflow, django_capture_on_commit_callbacks
):
    saver = get_checkpointer()
    ann = MemoryUser.objects.get(canonical_id="chat:ann")
    service.link_identity(ann.pk, "email", "ann@example.org")
    thread_id = threads["ann"]
    # An interrupted step leaves pending writes on the head checkpoint.
    head = saver.get_tuple(config(thread_id))
    saver.put_writes(head.config, [("messages", "half-finished")], task_id="interrupted-task")
    assert saver.get_tuple(head.config).pending_writes

    with django_capture_on_commit_callbacks(execute=True):
        result = service.delete_users([ann.pk], cascade=True)
    assert result.deleted == 1

    assert not MemoryUser.objects.filter(pk=ann.pk).exists()
    assert not Fact.objects.filter(user_id=ann.pk).exists() and not Episode.objects.filter(user_id=ann.pk).exists()
    assert not ChannelIdentity.objects.filter(user_id=ann.pk).exists()
    assert not Thread.objects.filter(user_id=ann.pk).exists()
    assert list(saver.list(config(thread_id))) == [] and saver.get_tuple(config(thread_id)) is None
    # The writes went too: the same checkpoint written again comes back without them.
    saver.put(config(thread_id), head.checkpoint, head.metadata, {})
    restored = saver.get_tuple(head.config)
    assert restored is not None and restored.pending_writes == []
    saver.delete_thread(thread_id)
    # Bob's thread is untouched, and the API agrees.
    assert saved(threads["bob"])
    assert thread_ids(api.get("/api/v1/checkpoints/")) == [threads["bob"]]
    assert api.get(f"/api/v1/checkpoints/{thread_id}/").status_code == 404


@pytest.mark.parametrize("params", [{"before": ""}, {"limit": ""}])
def test_blank_page_parameters_are_refused_not_ignored(api, threads, params):
    response = api.get(f"/api/v1/checkpoints/{threads['ann']}/", params)
    assert response.status_code == 400 and set(params) <= set(response.json())
    assert api.get("/api/v1/checkpoints/", {"page": ""}).status_code == 400
