"""The REST API of fact history, the promotion ledger and the memory graph: read only, staff only, strict filters."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from memory.learning.consolidation import BaseExtractor, ExtractedFact
from memory.models import Fact, FactHistory, FactVersion, MemoryRelation, Promotion, Scope
from memory.recall.upkeep import flush_buffers

pytestmark = pytest.mark.django_db

PATHS = ["fact-versions", "promotions", "relations"]


class TeaExtractor(BaseExtractor):
    def extract(self, episode):
        return [ExtractedFact(key="drink", value="green tea", fact_type="user_preference")]


@pytest.fixture
def graph(service, user_factory, keyword_only, django_capture_on_commit_callbacks):
    """Ann's city changed once (history and a contradicts edge), a consolidated episode (a supports
    edge), a session fact promoted to her own; Bob's fact."""
    ann, bob = user_factory("ann"), user_factory("bob")
    city = service.set_fact("city", "Porto", scope="user", user_id=ann.pk).fact
    with django_capture_on_commit_callbacks(execute=True):
        service.set_fact("city", "Lisbon", scope="user", user_id=ann.pk)
    service.set_fact("city", "Oslo", scope="user", user_id=bob.pk)
    episode = service.record_episode(started_at=timezone.now(), success=True, user_id=ann.pk, summary="tea talk")
    service.consolidate(extractor=TeaExtractor())
    service.set_fact("favourite_snack", "figs", scope=Scope.SESSION, session_id="s1", fact_type="user_preference")
    for _ in range(3):
        assert service.recall("favourite snack", agent_id="helper", user_id=ann.pk, session_id="s1")
    assert service.promote().promoted
    flush_buffers()  # what the end of the request that wrote them would write
    return {"ann": ann, "bob": bob, "city": city, "episode": episode, "drink": Fact.objects.get(key="drink")}


def results(response):
    assert response.status_code == 200, response.content
    return response.json()["results"]


@pytest.mark.parametrize("path", PATHS)
def test_only_staff_may_read(path, graph, django_user_model):
    assert APIClient().get(f"/api/v1/{path}/").status_code == 401
    visitor = APIClient()
    token = Token.objects.create(user=django_user_model.objects.create_user("visitor")).key
    visitor.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert visitor.get(f"/api/v1/{path}/").status_code == 403


@pytest.mark.parametrize("path", PATHS)
def test_nothing_can_be_deleted(api, graph, path):
    counts = (FactHistory.objects.count(), Promotion.objects.count(), MemoryRelation.objects.count())
    row = results(api.get(f"/api/v1/{path}/"))[0]
    assert api.delete(f"/api/v1/{path}/{row['id']}/").status_code in (404, 405)
    assert api.post(f"/api/v1/{path}/batch-delete/", {"ids": [row["id"]]}, format="json").status_code in (404, 405)
    assert (FactHistory.objects.count(), Promotion.objects.count(), MemoryRelation.objects.count()) == counts


def test_a_facts_history_with_filters(api, graph):
    ann, city = graph["ann"], graph["city"]
    history = results(api.get("/api/v1/fact-versions/", {"fact": city.pk, "ordering": "valid_from"}))
    assert [(v["action"], v["value"], v["user"]) for v in history] == [
        ("created", "Porto", ann.pk),
        ("updated", "Lisbon", ann.pk),
    ]
    assert {v["value"] for v in results(api.get("/api/v1/fact-versions/", {"key": "city"}))} == {
        "Porto",
        "Lisbon",
        "Oslo",
    }
    assert [v["value"] for v in results(api.get("/api/v1/fact-versions/", {"key": "city", "action": "updated"}))] == [
        "Lisbon"
    ]
    by_bob = results(api.get("/api/v1/fact-versions/", {"user": graph["bob"].pk, "scope": "user"}))
    assert [v["value"] for v in by_bob] == ["Oslo"]
    one = api.get(f"/api/v1/fact-versions/{history[0]['id']}/").json()
    assert (one["fact_id"], one["scope_key"], one["value"]) == (city.pk, f"user:{ann.pk}", "Porto")
    # The fact's current version is its row, listed under -<fact id> until a change supersedes it.
    assert [(v["current"], v["id"]) for v in history] == [(False, history[0]["id"]), (True, -city.pk)]
    assert api.get(f"/api/v1/fact-versions/{-city.pk}/").json()["value"] == "Lisbon"
    current = results(api.get("/api/v1/fact-versions/", {"key": "city", "current": "true"}))
    assert sorted(v["value"] for v in current) == ["Lisbon", "Oslo"]
    bad = api.get("/api/v1/fact-versions/", {"current": "maybe"})
    assert bad.status_code == 400 and "current" in bad.json()
    # A time range: nothing is valid from the future on, everything from yesterday on.
    later = (timezone.now() + timedelta(days=1)).isoformat()
    assert results(api.get("/api/v1/fact-versions/", {"valid_from_after": later})) == []
    assert len(results(api.get("/api/v1/fact-versions/", {"valid_from_before": later}))) == FactHistory.objects.count()


def test_a_time_with_any_utc_offset_filters_the_history_and_one_out_of_range_is_refused(api, graph):
    """ISO 8601 allows offsets PostgreSQL does not (up to 24 hours against 15:59): the time is
    compared in UTC, and one that leaves the calendar in UTC is a 400 naming the filter."""
    everything = FactHistory.objects.count()
    far_west = (timezone.now() - timedelta(days=1)).astimezone(timezone.get_fixed_timezone(-(20 * 60 + 19)))
    assert len(results(api.get("/api/v1/fact-versions/", {"valid_from_after": far_west.isoformat()}))) == everything
    assert results(api.get("/api/v1/fact-versions/", {"valid_from_before": "0103-12-08T20:57:43-20:19"})) == []
    bad = api.get("/api/v1/fact-versions/", {"valid_from_after": "0001-01-01T00:00:00+05:00"})
    assert bad.status_code == 400 and "valid_from_after" in bad.json()


def test_the_promotion_ledger_with_filters(api, graph):
    ann = graph["ann"]
    ledger = Promotion.objects.get()
    rows = results(api.get("/api/v1/promotions/", {"rule": "session_fact", "user": ann.pk, "source_kind": "fact"}))
    assert [(r["id"], r["rule"], r["user"], r["recalls"]) for r in rows] == [(ledger.pk, "session_fact", ann.pk, 3)]
    assert rows[0]["fact_ids"] == [Fact.objects.get(key="favourite_snack", scope=Scope.USER).pk]
    assert results(api.get("/api/v1/promotions/", {"source_kind": "episode"})) == []
    assert results(api.get("/api/v1/promotions/", {"user": graph["bob"].pk})) == []
    assert api.get(f"/api/v1/promotions/{ledger.pk}/").json()["source_id"] == ledger.source_id


def test_relations_name_memories_not_documents(api, graph):
    city, episode, drink = graph["city"], graph["episode"], graph["drink"]
    replaced = FactVersion.objects.get(fact_id=city.pk, value="Porto")
    edges = {
        (r["source_kind"], r["source_item"], r["relation"], r["target_kind"], r["target_item"])
        for r in results(api.get("/api/v1/relations/"))
    }
    assert edges == {
        ("fact", city.pk, "contradicts", "fact_version", replaced.pk),
        ("fact", drink.pk, "supports", "episode", episode.pk),
    }
    # One memory's edges, in either direction (the episode is a target).
    of_episode = results(api.get("/api/v1/relations/", {"kind": "episode", "item": episode.pk}))
    assert [(r["source_item"], r["relation"]) for r in of_episode] == [(drink.pk, "supports")]
    of_drink = results(api.get("/api/v1/relations/", {"kind": "fact", "item": drink.pk, "relation": "supports"}))
    assert [r["target_item"] for r in of_drink] == [episode.pk]
    assert [r["relation"] for r in results(api.get("/api/v1/relations/", {"relation": "contradicts"}))] == [
        "contradicts"
    ]
    assert results(api.get("/api/v1/relations/", {"kind": "procedure", "item": 1})) == []


@pytest.mark.parametrize(
    "path,params,field",
    [
        ("fact-versions", {"fact": "abc"}, "fact"),
        ("fact-versions", {"user": "0"}, "user"),
        ("fact-versions", {"scope": "planet"}, "scope"),
        ("fact-versions", {"action": "erased"}, "action"),
        ("fact-versions", {"valid_from_after": "yesterday"}, "valid_from_after"),
        ("fact-versions", {"valid_from": "2024-01-01"}, "valid_from"),
        ("fact-versions", {"ordering": "value"}, "ordering"),
        ("promotions", {"rule": "magic"}, "rule"),
        ("promotions", {"source_kind": "thread"}, "source_kind"),
        ("promotions", {"user": str(2**63)}, "user"),
        ("relations", {"relation": "likes"}, "relation"),
        ("relations", {"kind": "fact"}, "item"),
        ("relations", {"item": "3"}, "kind"),
        ("relations", {"kind": "thread", "item": "3"}, "kind"),
        ("relations", {"kind": "fact", "item": "1.5"}, "item"),
        ("relations", {"source": "1"}, "source"),
    ],
)
def test_bad_parameters_are_a_400_naming_them(api, graph, path, params, field):
    response = api.get(f"/api/v1/{path}/", params)
    assert response.status_code == 400
    assert field in response.json()


def test_the_schema_documents_the_new_endpoints(api):
    paths = api.get("/api/schema/", {"format": "json"}).json()["paths"]
    assert set(paths["/api/v1/fact-versions/"]) == {"get"}
    assert set(paths["/api/v1/fact-versions/{id}/"]) == {"get"}
    assert set(paths["/api/v1/promotions/{id}/"]) == {"get"}
    assert set(paths["/api/v1/relations/"]) == {"get"}
    assert "/api/v1/relations/{id}/" not in paths
    names = {p["name"] for p in paths["/api/v1/relations/"]["get"]["parameters"]}
    assert {"relation", "kind", "item", "ordering", "page"} <= names
    names = {p["name"] for p in paths["/api/v1/fact-versions/"]["get"]["parameters"]}
    assert {"fact", "user", "scope", "key", "action", "valid_from_after", "valid_from_before"} <= names
