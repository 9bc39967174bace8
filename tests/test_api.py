"""The operators' REST API: who may use it, lists with filters and pinned query counts, deletes, batch deletes."""

import json

import pytest
from django.test.utils import override_settings
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from memory.conf import memory_settings
from memory.models import ChannelIdentity, Episode, Fact, MemoryUser, Procedure

pytestmark = pytest.mark.django_db

KINDS = ["facts", "episodes", "procedures", "memory-users"]


@pytest.fixture
def memories(service, user_factory):
    """Two users with facts and episodes, a global and an agent fact, two procedures."""
    ann, bob = user_factory("ann"), user_factory("bob")
    service.link_identity(ann.pk, "email", "ann@example.org")
    ep_ann = service.start_episode(agent_id="planner", user_id=ann.pk, trigger_type="telegram")
    service.complete_episode(ep_ann.pk, success=True, summary="booked a table for ann")
    ep_bob = service.start_episode(agent_id="support", user_id=bob.pk, trigger_type="chat")
    service.set_fact(
        "favourite_tea",
        "oolong",
        scope="user",
        user_id=ann.pk,
        fact_type="user_preference",
        source_episode_id=ep_ann.pk,
    )
    service.set_fact("home_city", "Lyon", scope="user", user_id=ann.pk, fact_type="relationship")
    service.set_fact("favourite_tea", "green", scope="user", user_id=bob.pk, fact_type="user_preference")
    service.set_fact("capital_of_france", "Paris")
    service.set_fact("office_hours", "9-17", scope="agent", agent_id="support")
    weather = service.save_procedure("weather", trigger_conditions={"goal_contains": ["weather"]})
    service.save_procedure("refund", agent_id="support", parent_id=weather.pk)
    return {"ann": ann, "bob": bob, "ep_ann": ep_ann, "ep_bob": ep_bob}


def ids(response):
    return [row["id"] for row in response.json()["results"]]


# ------------------------------------------------------------------ who may use it


@pytest.mark.parametrize("kind", KINDS)
def test_anonymous_requests_are_refused_on_every_endpoint(kind, memories):
    client = APIClient()
    one = {"facts": Fact, "episodes": Episode, "procedures": Procedure, "memory-users": MemoryUser}[
        kind
    ].objects.first()
    before = Fact.objects.count()
    for method, path, body in [
        ("get", f"/api/v1/{kind}/", None),
        ("get", f"/api/v1/{kind}/{one.pk}/", None),
        ("delete", f"/api/v1/{kind}/{one.pk}/", None),
        ("post", f"/api/v1/{kind}/batch-delete/", {"ids": [one.pk]}),
    ]:
        response = getattr(client, method)(path, body, format="json")
        assert response.status_code == 401, (method, path)
        assert response["WWW-Authenticate"] == "Token"
    assert Fact.objects.count() == before
    assert type(one).objects.filter(pk=one.pk).exists()


@pytest.mark.parametrize("kind", KINDS)
def test_authenticated_non_staff_are_refused(kind, memories, django_user_model):
    user = django_user_model.objects.create_user("visitor")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    assert client.get(f"/api/v1/{kind}/").status_code == 403
    fact = Fact.objects.first()
    response = client.post("/api/v1/facts/batch-delete/", {"ids": [fact.pk]}, format="json")
    assert response.status_code == 403
    assert Fact.objects.filter(pk=fact.pk).exists()


def test_schema_and_docs_are_staff_only(api):
    anonymous = APIClient()
    assert anonymous.get("/api/schema/").status_code == 401
    assert anonymous.get("/api/docs/").status_code == 401
    response = api.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    paths = json.loads(response.content)["paths"]
    for kind in KINDS:
        assert f"/api/v1/{kind}/batch-delete/" in paths
        assert "200" in paths[f"/api/v1/{kind}/batch-delete/"]["post"]["responses"]
    assert api.get("/api/docs/").status_code == 200


def test_a_session_needs_its_csrf_token(staff, memories):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(staff)
    assert client.get("/api/v1/facts/").status_code == 200
    fact = Fact.objects.first()
    response = client.post("/api/v1/facts/batch-delete/", {"ids": [fact.pk]}, format="json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]
    assert Fact.objects.filter(pk=fact.pk).exists()


def test_a_request_body_over_the_limit_is_refused(api, memories):
    fact = Fact.objects.first()
    padding = " " * (memory_settings.API_MAX_BODY_BYTES + 1)
    response = api.post(
        "/api/v1/facts/batch-delete/", f'{{"ids": [{fact.pk}]}}{padding}', content_type="application/json"
    )
    assert response.status_code == 413
    assert Fact.objects.filter(pk=fact.pk).exists()


def test_only_json_bodies_are_accepted(api, memories):
    fact = Fact.objects.first()
    response = api.post("/api/v1/facts/batch-delete/", {"ids": [fact.pk]}, format="multipart")
    assert response.status_code == 415
    assert Fact.objects.filter(pk=fact.pk).exists()


# ------------------------------------------------------------------ lists


def test_fact_list_has_a_total_count_and_pages(api, service):
    for n in range(7):
        service.set_fact(f"note_{n}", n)
    response = api.get("/api/v1/facts/", {"page_size": 3, "ordering": "key"})
    body = response.json()
    assert body["count"] == 7
    assert [r["key"] for r in body["results"]] == ["note_0", "note_1", "note_2"]
    assert body["next"] is not None and body["previous"] is None
    page3 = api.get("/api/v1/facts/", {"page_size": 3, "ordering": "key", "page": 3}).json()
    assert [r["key"] for r in page3["results"]] == ["note_6"]
    assert api.get("/api/v1/facts/", {"page": 99}).status_code == 404


def test_fact_filters(api, memories):
    ann = memories["ann"]
    assert {r["key"] for r in api.get("/api/v1/facts/", {"scope": "user", "user": ann.pk}).json()["results"]} == {
        "favourite_tea",
        "home_city",
    }
    assert [r["key"] for r in api.get("/api/v1/facts/", {"agent_id": "support"}).json()["results"]] == ["office_hours"]
    assert {r["value"] for r in api.get("/api/v1/facts/", {"fact_type": "user_preference"}).json()["results"]} == {
        "oolong",
        "green",
    }
    # Text search: every word, in key or value, separators equivalent.
    assert [r["key"] for r in api.get("/api/v1/facts/", {"search": "capital france"}).json()["results"]] == [
        "capital_of_france"
    ]
    assert [r["value"] for r in api.get("/api/v1/facts/", {"search": "favourite-tea oolong"}).json()["results"]] == [
        "oolong"
    ]
    ordered = api.get("/api/v1/facts/", {"ordering": "-key"}).json()["results"]
    assert [r["key"] for r in ordered] == sorted((r["key"] for r in ordered), reverse=True)


def test_filters_with_bad_values_name_the_field(api, memories):
    response = api.get("/api/v1/facts/", {"scope": "planet"})
    assert response.status_code == 400
    assert "scope" in response.json()
    response = api.get("/api/v1/facts/", {"user": "ann"})
    assert response.status_code == 400
    assert "user" in response.json()


@pytest.mark.parametrize(
    "path,params,field",
    [
        ("facts", {"page_size": "abc"}, "page_size"),
        ("facts", {"page_size": "0"}, "page_size"),
        ("facts", {"user": str(2**63)}, "user"),
        ("facts", {"user": "1.5"}, "user"),
        ("episodes", {"success": "null"}, "success"),
        ("procedures", {"is_active": "maybe"}, "is_active"),
    ],
)
def test_malformed_query_parameters_are_refused_not_ignored(api, memories, path, params, field):
    response = api.get(f"/api/v1/{path}/", params)
    assert response.status_code == 400
    assert field in response.json()


@pytest.mark.parametrize("kind", KINDS)
def test_a_malformed_id_in_the_url_is_a_json_404(api, kind):
    for ident in ["0.5", "abc", str(2**70)]:
        response = api.get(f"/api/v1/{kind}/{ident}/")
        assert response.status_code == 404
        assert response["Content-Type"] == "application/json"


def test_episode_procedure_and_user_filters(api, memories):
    ann = memories["ann"]
    assert ids(api.get("/api/v1/episodes/", {"user": ann.pk})) == [memories["ep_ann"].pk]
    assert ids(api.get("/api/v1/episodes/", {"agent_id": "support"})) == [memories["ep_bob"].pk]
    assert ids(api.get("/api/v1/episodes/", {"success": "true"})) == [memories["ep_ann"].pk]
    assert ids(api.get("/api/v1/episodes/", {"search": "table ann"})) == [memories["ep_ann"].pk]
    assert [r["name"] for r in api.get("/api/v1/procedures/", {"agent_id": "support"}).json()["results"]] == ["refund"]
    assert [r["name"] for r in api.get("/api/v1/procedures/", {"search": "weath"}).json()["results"]] == ["weather"]
    users = api.get("/api/v1/memory-users/", {"channel": "email"}).json()["results"]
    assert [u["id"] for u in users] == [ann.pk]
    assert users[0]["email"] == "ann@example.org"
    assert {i["channel"] for i in users[0]["identities"]} == {"test", "email"}
    assert users[0]["fact_count"] == 2 and users[0]["episode_count"] == 1
    assert ids(api.get("/api/v1/memory-users/", {"search": "ann@example"})) == [ann.pk]


@pytest.mark.parametrize(
    "kind,queries",
    [
        ("facts", 2),  # count, page
        ("episodes", 2),
        ("procedures", 2),
        ("memory-users", 3),  # count, page (fact and episode counts as subqueries), identities prefetched
    ],
)
def test_list_query_counts_do_not_grow_with_rows(kind, queries, api, service, user_factory, capture_data_queries):
    def grow(n):
        for i in range(n):
            user = user_factory()
            service.link_identity(user.pk, "email", f"{user.pk}@example.org")
            service.set_fact(f"k{user.pk}", i, scope="user", user_id=user.pk)
            service.start_episode(agent_id="a", user_id=user.pk)
            service.save_procedure(f"p{user.pk}")

    api.get(f"/api/v1/{kind}/")  # token lookups and the like are not what is measured; warm up once
    grow(3)
    with capture_data_queries() as small:
        assert api.get(f"/api/v1/{kind}/").status_code == 200
    grow(20)
    with capture_data_queries() as large:
        response = api.get(f"/api/v1/{kind}/")
    assert response.json()["count"] >= 23
    auth = 1  # the token (with its user) in one query
    assert len(small.data) == len(large.data) == queries + auth, large.data


def test_no_endpoint_returns_another_kinds_data(api, memories):
    fact = api.get("/api/v1/facts/").json()["results"][0]
    assert set(fact) == {
        "id",
        "key",
        "value",
        "fact_type",
        "scope",
        "scope_key",
        "agent_id",
        "user",
        "session_id",
        "team",
        "confidence",
        "tags",
        "pinned",
        "times_confirmed",
        "times_contradicted",
        "source_episode",
        "provenance",
        "access_count",
        "last_accessed",
        "concepts",
        "created_at",
        "updated_at",
        "valid_from",
        "valid_to",
    }
    episode_id = memories["ep_ann"].pk
    assert not Fact.objects.filter(pk=episode_id + 1000).exists()
    assert api.get(f"/api/v1/facts/{episode_id + 1000}/").status_code == 404
    user = api.get(f"/api/v1/memory-users/{memories['ann'].pk}/").json()
    assert "facts" not in user and "episodes" not in user  # counts only; facts are read from /facts/?user=


# ------------------------------------------------------------------ deletes


def test_delete_one_fact(api, memories):
    fact = Fact.objects.get(key="capital_of_france")
    assert api.delete(f"/api/v1/facts/{fact.pk}/").status_code == 204
    assert not Fact.objects.filter(pk=fact.pk).exists()
    assert api.delete(f"/api/v1/facts/{fact.pk}/").status_code == 404


def test_batch_delete_happy_path(api, memories, service):
    facts = list(Fact.objects.filter(key="favourite_tea").values_list("pk", flat=True))
    response = api.post("/api/v1/facts/batch-delete/", {"ids": facts}, format="json")
    assert response.status_code == 200
    assert response.json() == {"deleted": 2, "not_found": []}
    assert not Fact.objects.filter(pk__in=facts).exists()
    assert Fact.objects.count() == 3
    assert service.search_facts("oolong", user_id=memories["ann"].pk) == []  # the search index forgot them too


def test_batch_delete_reports_unknown_ids_and_deletes_the_rest(api, memories):
    fact = Fact.objects.get(key="capital_of_france")
    missing = Fact.objects.order_by("-pk").first().pk + 100
    response = api.post("/api/v1/facts/batch-delete/", {"ids": [fact.pk, missing]}, format="json")
    assert response.status_code == 200
    assert response.json() == {"deleted": 1, "not_found": [missing]}
    assert not Fact.objects.filter(pk=fact.pk).exists()


@pytest.mark.parametrize(
    "body,field",
    [
        ({"ids": ["12"]}, "ids"),
        ({"ids": [1.5]}, "ids"),
        ({"ids": [True]}, "ids"),
        ({"ids": [0]}, "ids"),
        ({"ids": [-3]}, "ids"),
        ({"ids": [None]}, "ids"),
        ({"ids": "1,2"}, "ids"),
        ({"ids": []}, "ids"),
        ({"ids": {"a": 1}}, "ids"),
        ({"ids": [2**63]}, "ids"),
        ({}, "ids"),
    ],
)
def test_batch_delete_refuses_malformed_ids_and_names_the_field(api, memories, body, field):
    before = Fact.objects.count()
    response = api.post("/api/v1/facts/batch-delete/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert Fact.objects.count() == before


def test_valid_and_malformed_ids_mixed_delete_nothing(api, memories):
    real = list(Fact.objects.values_list("pk", flat=True))
    response = api.post("/api/v1/facts/batch-delete/", {"ids": [*real, "x"]}, format="json")
    assert response.status_code == 400
    assert response.json()["ids"] == {
        str(len(real)): ["Must be an integer id (a JSON number without a fraction), got str."]
    }
    assert Fact.objects.count() == len(real)


def test_batch_delete_over_the_limit_is_refused(api, service):
    real = [service.set_fact(f"n{i}", i).fact.pk for i in range(3)]
    limit = memory_settings.API_MAX_BATCH_IDS
    response = api.post("/api/v1/facts/batch-delete/", {"ids": real + list(range(10**6, 10**6 + limit))}, format="json")
    assert response.status_code == 400
    assert "ids" in response.json()
    assert Fact.objects.count() == 3
    at_limit = real + list(range(10**6, 10**6 + limit - 3))
    response = api.post("/api/v1/facts/batch-delete/", {"ids": at_limit}, format="json")
    assert response.status_code == 200
    assert response.json()["deleted"] == 3 and len(response.json()["not_found"]) == limit - 3


def test_batch_delete_of_episodes_keeps_derived_facts(api, memories):
    episode = memories["ep_ann"]
    response = api.post("/api/v1/episodes/batch-delete/", {"ids": [episode.pk]}, format="json")
    assert response.json() == {"deleted": 1, "not_found": []}
    assert Fact.objects.get(key="favourite_tea", user=memories["ann"]).source_episode_id is None


def test_batch_delete_of_procedures_keeps_their_children(api, memories):
    weather = Procedure.objects.get(name="weather")
    response = api.post("/api/v1/procedures/batch-delete/", {"ids": [weather.pk]}, format="json")
    assert response.json() == {"deleted": 1, "not_found": []}
    assert Procedure.objects.get(name="refund").parent_id is None


def test_deleting_users_who_hold_memories_needs_cascade(api, memories):
    ann = memories["ann"]
    response = api.post("/api/v1/memory-users/batch-delete/", {"ids": [ann.pk]}, format="json")
    assert response.status_code == 409  # well-formed, but the users still hold memories
    assert "2 facts, 1 episodes, 2 identities" in response.json()["cascade"][0]
    assert MemoryUser.objects.filter(pk=ann.pk).exists() and Fact.objects.filter(user=ann).count() == 2
    assert api.delete(f"/api/v1/memory-users/{ann.pk}/").status_code == 409
    assert api.delete(f"/api/v1/memory-users/{ann.pk}/", QUERY_STRING="cascade=maybe").status_code == 400
    assert MemoryUser.objects.filter(pk=ann.pk).exists()


def test_forget_a_person_leaves_no_row_naming_them(api, memories, service, user_factory):
    ann, bob = memories["ann"], memories["bob"]
    alias = user_factory("ann-on-chat", channel="chat")
    service.set_fact("nickname", "annie", scope="user", user_id=alias.pk)
    service.merge_users(alias.pk, ann.pk)  # the same person on another channel
    response = api.post("/api/v1/memory-users/batch-delete/", {"ids": [ann.pk], "cascade": True}, format="json")
    assert response.status_code == 200
    body = response.json()
    # The test's transaction never commits, so the scrub after the commit is pending (and not complete).
    assert body.pop("erasure") == {"complete": False, "pending": True, "problems": [], "statistics_refreshed": []}
    assert body == {
        "deleted": 1,
        "not_found": [],
        "cascaded": {
            "facts": 3,
            "episodes": 1,
            "identities": 3,
            "merged_users": 1,
            "recall_events": 0,
            "threads": 0,
            "checkpoints": 0,
        },
    }
    gone = [ann.pk, alias.pk]
    assert not MemoryUser.objects.filter(pk__in=gone).exists()
    assert not Fact.objects.filter(user__in=gone).exists()
    assert not Episode.objects.filter(user__in=gone).exists()
    assert not ChannelIdentity.objects.filter(user__in=gone).exists()
    assert not MemoryUser.objects.filter(canonical_id__in=["test:ann", "chat:ann-on-chat"]).exists()
    assert not ChannelIdentity.objects.filter(external_id__in=["ann", "ann@example.org", "ann-on-chat"]).exists()
    # Nobody else lost anything.
    assert Fact.objects.filter(user=bob).count() == 1 and Episode.objects.filter(user=bob).count() == 1
    assert Fact.objects.filter(key="capital_of_france").exists()


def test_delete_one_user_with_cascade_query_parameter(api, memories):
    bob = memories["bob"]
    assert api.delete(f"/api/v1/memory-users/{bob.pk}/?cascade=true").status_code == 204
    assert not MemoryUser.objects.filter(pk=bob.pk).exists()
    assert not Fact.objects.filter(user_id=bob.pk).exists()


@pytest.mark.parametrize("cascade", [0, 1, "true", None])
def test_cascade_must_be_a_json_boolean(api, memories, cascade):
    ann = memories["ann"]
    response = api.post("/api/v1/memory-users/batch-delete/", {"ids": [ann.pk], "cascade": cascade}, format="json")
    assert response.status_code == 400
    assert "cascade" in response.json()
    assert MemoryUser.objects.filter(pk=ann.pk).exists()


def test_a_user_who_holds_nothing_is_deleted_without_cascade(api, service, user_factory):
    shell, survivor = user_factory("old"), user_factory("new")
    service.merge_users(shell.pk, survivor.pk)  # the shell keeps no identities, facts or episodes
    response = api.post("/api/v1/memory-users/batch-delete/", {"ids": [shell.pk]}, format="json")
    assert response.json() == {"deleted": 1, "not_found": []}
    assert MemoryUser.objects.filter(pk=survivor.pk).exists()


def test_a_failing_cascade_receiver_leaves_everything_in_place(api, memories):
    from memory.signals import users_deleting

    def refuse(**kwargs):
        raise RuntimeError("thread store unavailable")

    users_deleting.connect(refuse, dispatch_uid="test_refuse")
    try:
        with pytest.raises(RuntimeError):
            api.post(
                "/api/v1/memory-users/batch-delete/", {"ids": [memories["ann"].pk], "cascade": True}, format="json"
            )
    finally:
        users_deleting.disconnect(dispatch_uid="test_refuse")
    assert Fact.objects.filter(user=memories["ann"]).count() == 2
    assert MemoryUser.objects.filter(pk=memories["ann"].pk).exists()


@override_settings(MEMORY={"API_PAGE_SIZE": 2, "API_MAX_PAGE_SIZE": 3})
def test_page_size_comes_from_settings(api, service):
    for n in range(5):
        service.set_fact(f"k{n}", n)
    assert len(api.get("/api/v1/facts/").json()["results"]) == 2
    assert len(api.get("/api/v1/facts/", {"page_size": 3}).json()["results"]) == 3
    response = api.get("/api/v1/facts/", {"page_size": 4})  # over the maximum: refused, not capped
    assert response.status_code == 400 and response.json() == {"page_size": ["Must be at most 3."]}


def test_confidence_is_shown_rounded_not_as_float_noise(api, service):
    service.set_fact("tz", "UTC", scope="global", confidence=0.84)
    service.set_fact("tz", "UTC", scope="global")  # confirmed: 0.84 + 0.16 * 0.2 = 0.8720000000000001 stored
    [row] = api.get("/api/v1/facts/", {"search": "tz"}).json()["results"]
    assert row["confidence"] == 0.872 and repr(row["confidence"]) == "0.872"
