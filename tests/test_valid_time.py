"""Valid time: when a fact holds in the world (valid_from / valid_to), apart from when it was
recorded (fact history, as_of). Reads answer what holds now unless asked about another time."""

import datetime

import pytest
from django.utils import timezone

from memory.exceptions import InvalidMemoryArgument
from memory.models import Fact, FactHistory

pytestmark = pytest.mark.django_db

UTC = datetime.UTC


def at(year, month=1, day=1):
    return datetime.datetime(year, month, day, tzinfo=UTC)


@pytest.fixture
def ada(user_factory):
    return user_factory("ada")


def lives(service, ada, **when):
    found = service.get_fact("city", user_id=ada.pk, **when)
    return None if found is None else found.value


def test_a_later_value_closes_the_old_one_which_stays_readable_for_its_time(service, ada):
    service.set_fact("city", "Paris", scope="user", user_id=ada.pk, valid_from="2019-03-01")
    moved = service.set_fact("city", "Berlin", scope="user", user_id=ada.pk, valid_from="2025-06-01")
    assert moved.action == "updated"
    assert lives(service, ada) == "Berlin"
    assert lives(service, ada, valid_at="2024-07-01") == "Paris"  # where did she live in 2024?
    assert lives(service, ada, valid_at=at(2025, 6, 1)) == "Berlin"
    assert lives(service, ada, valid_at="2018-12-31") is None  # before anything we know of
    # The old value is closed, not erased: its version holds until the new value's start.
    old, new = service.fact_history(moved.fact.pk)
    assert (old.value, old.world_from, old.world_to) == ("Paris", at(2019, 3, 1), at(2025, 6, 1))
    assert (new.value, new.world_from, new.world_to, new.current) == ("Berlin", at(2025, 6, 1), None, True)
    # One row per owner and key still: the closed value lives in history.
    assert Fact.objects.filter(key="city").count() == 1
    [hit] = service.search_facts("berlin", user_id=ada.pk)
    assert hit.value == "Berlin"
    assert [f.value for f in service.search_facts("city", user_id=ada.pk, valid_at="2024-01-01")] == ["Paris"]
    assert service.search_facts("berlin", user_id=ada.pk, valid_at="2024-01-01") == []


def test_an_update_without_a_date_closes_the_old_value_when_it_was_learned(service, ada):
    service.set_fact("city", "Paris", scope="user", user_id=ada.pk)
    learned = timezone.now()
    service.set_fact("city", "Berlin", scope="user", user_id=ada.pk)
    assert lives(service, ada) == "Berlin"
    assert lives(service, ada, valid_at="2020-01-01") == "Paris"  # it held from "always" until we learned otherwise
    fact = Fact.objects.get(key="city")
    assert fact.valid_from is not None and fact.valid_from >= learned


def test_a_fact_that_ended_is_not_returned_by_default_but_is_at_its_time(service, ada):
    service.set_fact("employer", "Acme", scope="user", user_id=ada.pk, valid_from="2020-01-01", valid_to="2023-01-01")
    assert service.get_fact("employer", user_id=ada.pk) is None
    assert service.search_facts("acme", user_id=ada.pk) == []
    assert service.list_facts(user_id=ada.pk) == []
    assert service.get_fact("employer", user_id=ada.pk, valid_at="2021-05-05").value == "Acme"
    # A more general fact of the key answers while the person's own one does not hold.
    service.set_fact("employer", "unknown", scope="global")
    assert service.get_fact("employer", user_id=ada.pk).value == "unknown"
    assert service.get_fact("employer", user_id=ada.pk, valid_at="2021-05-05").value == "Acme"


def test_the_same_value_with_an_end_closes_it(service, ada):
    service.set_fact("employer", "Acme", scope="user", user_id=ada.pk, valid_from="2020-01-01")
    confirmed = service.set_fact("employer", "Acme", scope="user", user_id=ada.pk, valid_to="2024-01-01")
    assert confirmed.action == "confirmed"
    assert (confirmed.fact.valid_from, confirmed.fact.valid_to) == (at(2020), at(2024))
    assert service.get_fact("employer", user_id=ada.pk) is None
    assert service.get_fact("employer", user_id=ada.pk, valid_at="2022-01-01").value == "Acme"


def test_as_of_and_valid_at_answer_different_questions(service, ada):
    service.set_fact("city", "Paris", scope="user", user_id=ada.pk, valid_from="2019-03-01")
    before_we_heard = timezone.now()
    service.set_fact("city", "Berlin", scope="user", user_id=ada.pk, valid_from="2025-06-01")
    # Recorded time: what the memory said before it heard of the move (where she lived then: Paris).
    assert lives(service, ada, as_of=before_we_heard) == "Paris"
    # World time, as known now: where she lived at that moment (already Berlin, since 2025-06).
    assert lives(service, ada, valid_at=before_we_heard) == "Berlin"
    # Both: as recorded before the move was heard of, where she lived in 2024.
    assert lives(service, ada, as_of=before_we_heard, valid_at="2024-01-01") == "Paris"
    # As recorded before the first write, nothing.
    assert lives(service, ada, as_of=at(2001)) is None


@pytest.mark.parametrize(
    "arguments, field, problem",
    [
        ({"valid_from": "2025-06-01", "valid_to": "2025-01-01"}, "valid_to", "must be after valid_from"),
        ({"valid_from": "2025-06-01", "valid_to": "2025-06-01"}, "valid_to", "must be after valid_from"),
        ({"valid_from": "last spring"}, "valid_from", "ISO 8601"),
        ({"valid_to": 20250101}, "valid_to", "must be a datetime"),
        ({"valid_from": datetime.datetime(2025, 1, 1)}, "valid_from", "timezone-aware"),
    ],
)
def test_a_bad_valid_time_is_refused_naming_the_field_and_changes_nothing(service, ada, arguments, field, problem):
    service.set_fact("city", "Paris", scope="user", user_id=ada.pk)
    before = list(FactHistory.objects.values_list("id", "value", "world_from", "world_to"))
    with pytest.raises(InvalidMemoryArgument) as raised:
        service.set_fact("city", "Berlin", scope="user", user_id=ada.pk, **arguments)
    assert raised.value.field == field and problem in raised.value.message
    assert list(FactHistory.objects.values_list("id", "value", "world_from", "world_to")) == before


def test_a_past_value_cannot_replace_one_that_holds_now(service, ada):
    service.set_fact("city", "Berlin", scope="user", user_id=ada.pk, valid_from="2025-06-01")
    with pytest.raises(InvalidMemoryArgument) as raised:
        service.set_fact("city", "Lyon", scope="user", user_id=ada.pk, valid_from="2010-01-01", valid_to="2012-01-01")
    assert raised.value.field == "valid_to" and "one timeline" in raised.value.message
    assert lives(service, ada) == "Berlin" and FactHistory.objects.count() == 1


def test_bad_valid_at_is_refused_naming_the_field(service, ada):
    service.set_fact("city", "Paris", scope="user", user_id=ada.pk)
    for read in (
        lambda: service.get_fact("city", user_id=ada.pk, valid_at="soon"),
        lambda: service.search_facts("city", user_id=ada.pk, valid_at="soon"),
        lambda: service.recall("city", user_id=ada.pk, valid_at="soon"),
    ):
        with pytest.raises(InvalidMemoryArgument) as raised:
            read()
        assert raised.value.field == "valid_at"


def test_a_deleted_fact_holds_at_no_time(service, ada):
    fact = service.set_fact("city", "Paris", scope="user", user_id=ada.pk, valid_from="2019-01-01").fact
    service.delete_fact(fact.pk)
    assert lives(service, ada, valid_at="2020-01-01") is None


def test_recall_shows_facts_as_they_held_then(service, ada, keyword_only):
    service.set_fact("city", "Paris", scope="user", user_id=ada.pk, valid_from="2019-03-01")
    before_we_heard = timezone.now()
    service.set_fact("city", "Berlin", scope="user", user_id=ada.pk, valid_from="2025-06-01")
    service.set_fact("employer", "Acme", scope="user", user_id=ada.pk, valid_from="2020-01-01", valid_to="2023-01-01")

    def recalled(**when):
        return {h.item.key: h.item.value for h in service.recall("city employer", user_id=ada.pk, **when)}

    assert recalled() == {"city": "Berlin"}  # the job that ended is not recalled by default
    assert recalled(valid_at="2021-06-01") == {"city": "Paris", "employer": "Acme"}
    assert recalled(as_of=before_we_heard) == {"city": "Paris"}
    hit = service.recall("city", user_id=ada.pk, valid_at="2021-06-01")[0]
    fields = hit.as_dict()["item"]
    assert (hit.text, fields["value"], fields["valid_to"]) == ("city: Paris", "Paris", "2025-06-01T00:00:00+00:00")


# ---------------------------------------------------------------- REST


def test_rest_writes_a_fact_with_valid_time_and_reads_it_now_and_then(api, ada, keyword_only):
    created = api.post(
        "/api/v1/facts/",
        {"key": "city", "value": "Paris", "scope": "user", "user": ada.pk, "valid_from": "2019-03-01"},
        format="json",
    )
    assert created.status_code == 201, created.json()
    assert created.json()["action"] == "created"
    assert created.json()["fact"]["valid_from"] == "2019-03-01T00:00:00Z"
    moved = api.post(
        "/api/v1/facts/",
        {"key": "city", "value": "Berlin", "scope": "user", "user": ada.pk, "valid_from": "2025-06-01T00:00:00Z"},
        format="json",
    )
    assert moved.status_code == 200 and moved.json()["action"] == "updated"

    def lookup(**params):
        answer = api.get("/api/v1/facts/lookup/", {"key": "city", "user": ada.pk, **params})
        assert answer.status_code == 200, answer.json()
        return answer.json()["fact"]

    assert lookup()["value"] == "Berlin"
    then = lookup(valid_at="2024-07-01")
    assert (then["value"], then["valid_from"], then["valid_to"]) == (
        "Paris",
        "2019-03-01T00:00:00Z",
        "2025-06-01T00:00:00Z",
    )
    assert lookup(valid_at="2010-01-01") is None
    found = api.get("/api/v1/facts/search/", {"q": "city", "user": ada.pk, "valid_at": "2024-07-01"}).json()
    assert [f["value"] for f in found["results"]] == ["Paris"]
    recalled = api.get("/api/v1/recall/", {"q": "city", "user": ada.pk, "types": "facts", "valid_at": "2024-07-01"})
    assert [h["item"]["value"] for h in recalled.json()["results"]] == ["Paris"]
    [row] = api.get("/api/v1/facts/", {"user": ada.pk}).json()["results"]
    assert (row["value"], row["valid_from"], row["valid_to"]) == ("Berlin", "2025-06-01T00:00:00Z", None)
    versions = api.get("/api/v1/fact-versions/", {"fact": row["id"]}).json()["results"]
    closed = next(v for v in versions if v["value"] == "Paris")
    assert closed["world_to"] == "2025-06-01T00:00:00Z" and closed["recorded_world_to"] is None


@pytest.mark.parametrize(
    "body, field",
    [
        ({"valid_from": "2025-06-01", "valid_to": "2024-01-01"}, "valid_to"),
        ({"valid_from": "next Tuesday"}, "valid_from"),
        ({"valid_to": "2024-02-30"}, "valid_to"),
        ({"user": 999999}, "user"),
    ],
)
def test_rest_refuses_a_bad_date_naming_the_field_and_writes_nothing(api, ada, body, field):
    api.post("/api/v1/facts/", {"key": "city", "value": "Paris", "scope": "user", "user": ada.pk}, format="json")
    before = list(FactHistory.objects.values_list("id", "value", "world_from", "world_to"))
    answer = api.post(
        "/api/v1/facts/", {"key": "city", "value": "Berlin", "scope": "user", "user": ada.pk, **body}, format="json"
    )
    assert answer.status_code == 400 and field in answer.json(), answer.json()
    assert list(FactHistory.objects.values_list("id", "value", "world_from", "world_to")) == before


@pytest.mark.parametrize(
    "path, params",
    [
        ("/api/v1/facts/lookup/", {"key": "city", "valid_at": "yesterday"}),
        ("/api/v1/facts/search/", {"q": "city", "as_of": "2024-99-01"}),
        ("/api/v1/recall/", {"q": "city", "valid_at": "whenever"}),
    ],
)
def test_rest_reads_name_a_bad_time(api, ada, keyword_only, path, params):
    answer = api.get(path, params)
    assert answer.status_code == 400, answer.json()
    assert set(answer.json()) & {"valid_at", "as_of"}


def test_a_persons_context_shows_what_holds_now(service, ada):
    service.set_fact("employer", "Acme", scope="user", user_id=ada.pk, valid_from="2020-01-01", valid_to="2023-01-01")
    service.set_fact("city", "Paris", scope="user", user_id=ada.pk, valid_from="2019-03-01")
    service.set_fact("city", "Berlin", scope="user", user_id=ada.pk, valid_from="2025-06-01")
    assert {f["key"]: f["value"] for f in service.user_context(ada.pk).facts} == {"city": "Berlin"}
    service.link_identity(ada.pk, "email", "ada@example.org")
    identified = service.identify("email", "ada@example.org")
    assert {f["key"]: f["value"] for f in identified.context.facts} == {"city": "Berlin"}
