"""Edges of the operators' API: pagination parameters on every paginated endpoint, nesting, time limits."""

from datetime import UTC, datetime, timedelta, timezone

import pytest
from drf_spectacular.generators import SchemaGenerator

from memory.conf import memory_settings
from memory.exceptions import InvalidMemoryArgument
from memory.models import Episode, Fact, MemoryUser
from workflows.models import Workflow

pytestmark = pytest.mark.django_db


def paginated_lists():
    """Every GET operation of the schema that takes `page_size`, without path parameters."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return sorted(
        path
        for path, operations in schema["paths"].items()
        if "{" not in path and any(p["name"] == "page_size" for p in operations.get("get", {}).get("parameters", []))
    )


def test_every_paginated_list_is_found():
    lists = paginated_lists()
    for expected in ("/api/v1/facts/", "/api/v1/memory-users/", "/api/v1/checkpoints/", "/api/v1/reminders/"):
        assert expected in lists


@pytest.mark.parametrize("page", ["²", "٣", "0", "-1", "1.5", "abc", "１"])
def test_a_page_that_is_not_a_positive_integer_is_a_400_naming_page(api, page):
    for path in paginated_lists():
        response = api.get(path, {"page": page})
        assert response.status_code == 400, (path, response.status_code, response.content[:300])
        assert list(response.json()) == ["page"], (path, response.json())


def test_a_page_size_over_the_maximum_is_a_400_naming_it_and_the_maximum(api):
    top = memory_settings.API_MAX_PAGE_SIZE
    for path in paginated_lists():
        response = api.get(path, {"page_size": top + 1})
        assert response.status_code == 400, (path, response.status_code, response.content[:300])
        assert response.json() == {"page_size": [f"Must be at most {top}."]}, path
        assert api.get(path, {"page_size": top}).status_code == 200, path


def test_pages_still_work_and_the_schema_says_the_maximum(api, service):
    for n in range(5):
        service.set_fact(f"k{n}", n)
    assert [
        f["key"] for f in api.get("/api/v1/facts/", {"page_size": 2, "page": 3, "ordering": "key"}).json()["results"]
    ] == ["k4"]
    assert [
        f["key"]
        for f in api.get("/api/v1/facts/", {"page_size": 2, "page": "last", "ordering": "key"}).json()["results"]
    ] == ["k4"]
    assert api.get("/api/v1/facts/", {"page_size": 2, "page": 4}).status_code == 404  # past the last page
    schema = SchemaGenerator().get_schema(request=None, public=True)
    [size] = [p for p in schema["paths"]["/api/v1/facts/"]["get"]["parameters"] if p["name"] == "page_size"]
    assert size["schema"]["maximum"] == memory_settings.API_MAX_PAGE_SIZE


def nested(levels, inner=1):
    value = inner
    for _ in range(levels):
        value = [value]
    return value


def deep_text(levels):
    return "[" * levels + "1" + "]" * levels


@pytest.mark.parametrize("levels", [70, 5000])  # under and over the depth Python's own parser reaches
def test_nesting_too_deep_names_the_field_path_in_a_body(api, demo_workflow, levels):
    body = '{"user_id": "ann", "message": "hi", "meta": {"notes": ["x", ' + deep_text(levels) + "]}}"
    response = api.post(f"/api/v1/workflows/{demo_workflow.slug}/run/", body, content_type="application/json")
    assert response.status_code == 400
    assert response.json() == {"meta": ["meta.notes: is nested deeper than 64 levels"]}

    nodes = ['{"id": "a", "type": "recall"}'] * 3 + [
        '{"id": "d", "type": "agent", "config": {"x": ' + deep_text(levels) + "}}"
    ]
    body = '{"slug": "deep", "name": "deep", "definition": {"nodes": [' + ", ".join(nodes) + '], "edges": []}}'
    response = api.post("/api/v1/workflows/", body, content_type="application/json")
    assert response.status_code == 400
    assert response.json() == {"definition": ["definition.nodes[3].config.x: is nested deeper than 64 levels"]}
    assert not MemoryUser.objects.exists() and not Workflow.objects.filter(slug="deep").exists()


def test_nesting_too_deep_names_the_field_in_the_service(service):
    with pytest.raises(InvalidMemoryArgument) as raised:
        service.set_fact("k", {"notes": nested(70)})
    assert raised.value.field == "value" and raised.value.message == "value.notes: is nested deeper than 64 levels"
    with pytest.raises(InvalidMemoryArgument) as raised:
        service.set_fact("k", nested(70))
    assert raised.value.field == "value" and raised.value.message == "is nested deeper than 64 levels"
    assert not Fact.objects.exists()


def test_a_deep_chain_of_objects_is_named_up_to_a_readable_length(service):
    value = 1
    for _ in range(70):
        value = {"a": value}
    with pytest.raises(InvalidMemoryArgument) as raised:
        service.set_fact("k", value)
    assert raised.value.message == "value.a.a.a.a.a.a.a.a…: is nested deeper than 64 levels"


FAR_WEST = timezone(timedelta(hours=-14))
FAR_EAST = timezone(timedelta(hours=14))


@pytest.mark.parametrize(
    "moment", [datetime.max.replace(tzinfo=FAR_WEST), datetime.min.replace(tzinfo=FAR_EAST)], ids=["max", "min"]
)
def test_a_point_in_time_outside_utc_is_refused_naming_it(service, user_factory, moment):
    ada = user_factory("ada")
    service.set_fact("city", "Lyon", scope="user", user_id=ada.pk)
    for read in (
        lambda: service.get_fact("city", user_id=ada.pk, as_of=moment),
        lambda: service.search_facts("city", user_id=ada.pk, as_of=moment),
    ):
        with pytest.raises(InvalidMemoryArgument) as raised:
            read()
        assert raised.value.field == "as_of" and "out of range" in raised.value.message
    with pytest.raises(InvalidMemoryArgument) as raised:
        service.record_episode(started_at=moment, user_id=ada.pk, success=True)
    assert raised.value.field == "started_at" and not Episode.objects.exists()
    # The last moment that exists in UTC still answers.
    assert service.get_fact("city", user_id=ada.pk, as_of=datetime.max.replace(tzinfo=UTC)).value == "Lyon"


@pytest.mark.parametrize("name", ["valid_from_after", "valid_from_before"])
def test_a_time_filter_outside_utc_is_a_400_naming_it(api, name):
    for moment in ("9999-12-31T23:59:59.999999-14:00", "0001-01-01T00:00:00+14:00"):
        response = api.get("/api/v1/fact-versions/", {name: moment})
        assert response.status_code == 400 and list(response.json()) == [name], response.content


@pytest.mark.parametrize("method", ["get", "put", "delete", "options"])
def test_the_telegram_webhook_answers_other_methods_with_a_json_405(client, demo_workflow, method):
    response = getattr(client, method)(f"/telegram/{demo_workflow.slug}/webhook/")
    assert response.status_code == 405 and response["Allow"] == "POST"
    assert response["Content-Type"].startswith("application/json")
    assert "POST is required" in response.json()["errors"]["method"][0]
