"""Edges of the operators' API: pagination parameters on every paginated endpoint, nesting, time limits."""

import pytest
from drf_spectacular.generators import SchemaGenerator

from memory.conf import memory_settings

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
