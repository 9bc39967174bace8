"""Fact history: a version per change, point-in-time reads with the usual isolation, limits, transfer, erasure."""

import datetime
import io
import json

import pytest
from django.db import connection
from django.utils import timezone

from memory.exceptions import InvalidMemoryArgument
from memory.models import Fact, FactHistory, FactVersion

pytestmark = pytest.mark.django_db

AGENT = "planner"


def actions(fact_id):
    return [(v.action, v.value) for v in FactHistory.objects.filter(fact_id=fact_id).order_by("valid_from", "id")]


def test_a_create_stores_no_version_and_a_change_stores_the_state_it_replaced(service):
    fact = service.set_fact("tea", "oolong", provenance="told").fact
    assert not FactVersion.objects.exists()
    [current] = service.fact_history(fact.pk)
    assert (current.action, current.value, current.current, current.id) == ("created", "oolong", True, -fact.pk)
    service.set_fact("tea", "green", provenance="changed")
    [kept] = FactVersion.objects.all()
    assert (kept.action, kept.value, kept.provenance) == ("created", "oolong", "told")
    assert [(v.action, v.value, v.current) for v in service.fact_history(fact.pk)] == [
        ("created", "oolong", False),
        ("updated", "green", True),
    ]


def test_every_change_is_a_version(service, user_factory):
    ada = user_factory("ada")
    episode = service.start_episode(agent_id=AGENT, user_id=ada.pk)
    created = service.set_fact("city", "Porto", scope="user", user_id=ada.pk, provenance="told", confidence=0.5)
    fact_id = created.fact.pk
    service.set_fact("city", "Porto", scope="user", user_id=ada.pk, source_episode_id=episode.pk, provenance="again")
    service.set_fact("city", "Lisbon", scope="user", user_id=ada.pk, confidence=0.9, provenance="moved")
    service.set_fact("city", "Faro", scope="user", user_id=ada.pk, overwrite=False, provenance="doubt")
    service.edit_fact(fact_id, value="Braga", confidence=0.7, fact_type="user_preference")
    assert service.delete_fact(fact_id)
    versions = list(FactHistory.objects.filter(fact_id=fact_id).order_by("valid_from", "id"))
    assert [(v.action, v.value) for v in versions] == [
        ("created", "Porto"),
        ("confirmed", "Porto"),
        ("updated", "Lisbon"),
        ("skipped", "Lisbon"),  # the refused value is not what the fact said
        ("updated", "Braga"),
        ("deleted", "Braga"),
    ]
    assert [round(v.confidence, 3) for v in versions] == [0.5, 0.6, 0.9, 0.72, 0.7, 0.7]
    # Who wrote each change: the confirmation names its own writer and episode.
    assert [v.provenance for v in versions[:5]] == ["told", "again", "moved", "doubt", "edited by an operator"]
    assert versions[1].source_episode_id == episode.pk
    assert {(v.scope_key, v.user_id, v.key) for v in versions} == {(f"user:{ada.pk}", ada.pk, "city")}
    # valid_from is the write's own time: the fact's updated_at while it lived
    assert versions[0].valid_from == created.fact.created_at


def test_batch_deletes_and_pruned_facts_leave_a_deleted_version(service, settings):
    a = service.set_fact("a", 1).fact
    b = service.set_fact("b", 2).fact
    service.delete_facts([a.pk], actor="admin:root")
    assert actions(a.pk) == [("created", 1), ("deleted", 1)]
    assert FactHistory.objects.get(fact_id=a.pk, action="deleted").provenance == "deleted by admin:root"
    settings.MEMORY = {"LIMITS": {"MAX_FACTS": 1}}
    service.set_fact("c", 3)  # evicts b, the older
    assert not Fact.objects.filter(pk=b.pk).exists()
    assert actions(b.pk) == [("created", 2), ("deleted", 2)]


def test_history_off_writes_no_versions_and_refuses_as_of(service, settings):
    settings.MEMORY = {"FACT_HISTORY": False}
    fact = service.set_fact("a", 1).fact
    service.set_fact("a", 2)
    service.delete_fact(fact.pk)
    assert not FactHistory.objects.exists()
    with pytest.raises(InvalidMemoryArgument) as raised:
        service.get_fact("a", as_of=timezone.now())
    assert raised.value.field == "as_of" and "FACT_HISTORY" in raised.value.message


# ------------------------------------------------------------------ point-in-time reads


def test_as_of_answers_what_was_true_then(service, user_factory, django_assert_num_queries):
    ada = user_factory("ada")
    before = timezone.now()
    fact = service.set_fact("city", "Porto", scope="user", user_id=ada.pk).fact
    t_porto = timezone.now()
    service.set_fact("city", "Lisbon", scope="user", user_id=ada.pk)
    t_lisbon = timezone.now()
    service.delete_fact(fact.pk)
    t_deleted = timezone.now()
    service.set_fact("city", "Faro", scope="user", user_id=ada.pk)  # a new fact of the same key

    def at(when):
        version = service.get_fact("city", user_id=ada.pk, as_of=when)
        return None if version is None else version.value

    assert at(before) is None  # created after X: not there
    assert at(t_porto) == "Porto"
    assert at(t_lisbon) == "Lisbon"  # deleted after X: still answers at X
    assert at(t_deleted) is None
    assert at(timezone.now()) == "Faro" == service.get_fact("city", user_id=ada.pk).value
    with django_assert_num_queries(1):
        version = service.get_fact("city", user_id=ada.pk, as_of=t_lisbon)
    assert version.fact_id == fact.pk and version.action == "updated"
    # as_of in any time zone means the same instant
    lisbon_time = t_porto.astimezone(datetime.timezone(datetime.timedelta(hours=5)))
    assert at(lisbon_time) == "Porto"


def test_as_of_keeps_most_specific_wins(service, user_factory):
    ada = user_factory("ada")
    service.set_fact("tone", "global", scope="global")
    service.set_fact("tone", "agent", scope="agent", agent_id=AGENT)
    user_fact = service.set_fact("tone", "user", scope="user", user_id=ada.pk).fact
    session_fact = service.set_fact("tone", "session", scope="session", session_id="s1").fact
    t_all = timezone.now()
    service.delete_fact(session_fact.pk)
    t_no_session = timezone.now()
    service.delete_fact(user_fact.pk)
    viewer = {"agent_id": AGENT, "user_id": ada.pk, "session_id": "s1"}
    assert service.get_fact("tone", **viewer, as_of=t_all).value == "session"
    # the session's fact was deleted by then: the user's answers, as a current read would
    assert service.get_fact("tone", **viewer, as_of=t_no_session).value == "user"
    assert service.get_fact("tone", **viewer, as_of=timezone.now()).value == "agent"
    assert service.get_fact("tone", **viewer).value == "agent"


def test_as_of_never_shows_other_owners(service, user_factory):
    ada, bob = user_factory("ada"), user_factory("bob")
    service.set_fact("secret", "ada's", scope="user", user_id=ada.pk)
    service.set_fact("secret", "other agent's", scope="agent", agent_id="other")
    service.set_fact("secret", "other session's", scope="session", session_id="s2")
    bob_fact = service.set_fact("secret", "bob's", scope="user", user_id=bob.pk).fact
    then = timezone.now()
    service.delete_fact(bob_fact.pk)
    assert service.get_fact("secret", agent_id=AGENT, user_id=bob.pk, session_id="s1", as_of=then).value == "bob's"
    assert service.get_fact("secret", agent_id=AGENT, session_id="s1", as_of=then) is None
    found = service.search_facts("secret", agent_id=AGENT, user_id=bob.pk, session_id="s1", as_of=then)
    assert [v.value for v in found] == ["bob's"]
    assert service.search_facts("secret", agent_id=AGENT, session_id="s1", as_of=then) == []
    found = service.search_facts("secret", agent_id="other", user_id=ada.pk, as_of=then)
    assert [v.value for v in found] == ["ada's"]  # ada's shadows the agent's; bob's never shows


def test_search_as_of_matches_words_shadows_and_orders(service, user_factory):
    ada = user_factory("ada")
    service.set_fact("favourite_tea", "oolong", scope="global", confidence=0.9)
    service.set_fact("favourite_tea", "green tea", scope="user", user_id=ada.pk, confidence=0.4)
    service.set_fact("favourite_coffee", "espresso", scope="user", user_id=ada.pk, confidence=0.8)
    gone = service.set_fact("favourite_cake", "lemon", scope="user", user_id=ada.pk, confidence=0.6).fact
    then = timezone.now()
    service.delete_fact(gone.pk)
    service.set_fact("favourite_coffee", "latte", scope="user", user_id=ada.pk, confidence=0.3)
    service.set_fact("favourite_juice", "orange", scope="user", user_id=ada.pk)
    found = service.search_facts("favourite", user_id=ada.pk, as_of=then)
    # the user's tea hides the global one (whatever the confidence); most confident first
    assert [(v.key, v.value) for v in found] == [
        ("favourite_coffee", "espresso"),
        ("favourite_cake", "lemon"),
        ("favourite_tea", "green tea"),
    ]
    assert [v.key for v in service.search_facts("favourite", user_id=ada.pk, as_of=then, limit=1)] == [
        "favourite_coffee"
    ]
    assert [v.value for v in service.search_facts("tea", user_id=ada.pk, as_of=then)] == ["green tea"]
    assert service.search_facts("favourite", user_id=ada.pk, as_of=then, min_confidence=0.7)[0].value == "espresso"
    assert service.search_facts("oolong", user_id=ada.pk, as_of=then) == []  # shadowed then too
    assert [v.value for v in service.search_facts("oolong", as_of=then)] == ["oolong"]


def test_as_of_follows_merged_users(service, user_factory):
    ada, old = user_factory("ada"), user_factory("old-ada")
    service.set_fact("pet", "cat", scope="user", user_id=old.pk)
    service.set_fact("city", "Porto", scope="user", user_id=old.pk)
    service.set_fact("city", "Lisbon", scope="user", user_id=ada.pk)  # newer: kept
    before_merge = timezone.now()
    service.merge_users(old.pk, ada.pk)
    assert set(FactHistory.objects.values_list("user_id", flat=True)) == {ada.pk}
    assert service.get_fact("pet", user_id=old.pk, as_of=before_merge).value == "cat"
    assert service.get_fact("pet", user_id=ada.pk, as_of=before_merge).value == "cat"
    assert service.get_fact("city", user_id=old.pk, as_of=timezone.now()).value == "Lisbon"
    kept = Fact.objects.get(key="city")
    assert actions(kept.pk)[-1] == ("skipped", "Lisbon")
    assert FactHistory.objects.filter(fact_id=kept.pk).last().provenance == f"merge of memory user {old.pk}"


@pytest.mark.parametrize(
    "as_of, problem",
    [
        ("the first of May", "must be an ISO 8601 date or datetime"),
        ("2024-13-01", "must be an ISO 8601 date or datetime"),
        (1700000000, "must be a datetime"),
        (datetime.datetime(2024, 1, 1, 12, 0), "timezone-aware"),
    ],
)
def test_bad_as_of_is_refused_naming_the_field(service, as_of, problem):
    service.set_fact("a", 1)
    before = list(FactHistory.objects.values_list("pk", "action"))
    for read in (lambda: service.get_fact("a", as_of=as_of), lambda: service.search_facts("a", as_of=as_of)):
        with pytest.raises(InvalidMemoryArgument) as raised:
            read()
        assert raised.value.field == "as_of" and problem in raised.value.message
    assert list(FactHistory.objects.values_list("pk", "action")) == before
    assert Fact.objects.get().access_count == 0


# ------------------------------------------------------------------ reading a fact's history


def test_fact_history_by_id_and_by_key_and_owner(service, user_factory):
    ada = user_factory("ada")
    first = service.set_fact("city", "Porto", scope="user", user_id=ada.pk).fact
    service.set_fact("city", "Lisbon", scope="user", user_id=ada.pk)
    service.delete_fact(first.pk)
    second = service.set_fact("city", "Faro", scope="user", user_id=ada.pk).fact
    service.set_fact("city", "Faro", scope="agent", agent_id=AGENT)
    assert [v.action for v in service.fact_history(first.pk)] == ["created", "updated", "deleted"]
    by_key = service.fact_history(key="city", scope="user", user_id=ada.pk)
    assert [(v.fact_id, v.action) for v in by_key] == [
        (first.pk, "created"),
        (first.pk, "updated"),
        (first.pk, "deleted"),
        (second.pk, "created"),
    ]
    assert [v.value for v in service.fact_history(key="city", scope="user", user_id=ada.pk, limit=2)] == [
        "Lisbon",
        "Faro",
    ]
    assert service.fact_history(999_999) == []
    for bad, field in [
        ({}, "fact_id"),
        ({"fact_id": first.pk, "key": "city"}, "fact_id"),
        ({"fact_id": "x"}, "fact_id"),
        ({"key": "city", "scope": "user"}, "user_id"),
        ({"key": "city", "scope": "planet"}, "scope"),
        ({"fact_id": first.pk, "limit": 0}, "limit"),
    ]:
        with pytest.raises(InvalidMemoryArgument) as raised:
            service.fact_history(**bad)
        assert raised.value.field == field


# ------------------------------------------------------------------ limits


def test_max_versions_per_fact_keeps_the_latest(service, settings, capture_data_queries, keyword_only):
    settings.MEMORY = {"LIMITS": {"MAX_VERSIONS_PER_FACT": 3}}
    fact = service.set_fact("n", 0).fact
    with capture_data_queries() as q:
        service.set_fact("n", 1)  # 2 versions: no trim, no extra statement
    # The locked read and the update; the version is part of the update's statement on PostgreSQL.
    assert len(q.data) == (2 if connection.vendor == "postgresql" else 3), q.data
    for i in range(2, 7):
        service.set_fact("n", i)
    assert [v.value for v in service.fact_history(fact.pk)] == [4, 5, 6]
    # Operator edits bump no counter: edit_fact trims itself.
    service.edit_fact(fact.pk, value=7, confidence=0.5, fact_type="world_knowledge")
    assert [v.value for v in service.fact_history(fact.pk)] == [5, 6, 7]


def test_prune_trims_versions_over_the_limit(service, settings):
    kept = service.set_fact("kept", 0).fact
    for i in range(1, 5):
        service.set_fact("kept", i)
    gone = service.set_fact("gone", 0).fact
    service.set_fact("gone", 1)
    service.delete_fact(gone.pk)
    service.set_fact("few", 0, scope="agent", agent_id=AGENT)
    settings.MEMORY = {"LIMITS": {"MAX_VERSIONS_PER_FACT": 2, "PER_AGENT": {AGENT: {"MAX_VERSIONS_PER_FACT": 1}}}}
    dry = service.prune(dry_run=True)
    assert dry.deleted["fact_versions"] == 3 + 1
    assert FactHistory.objects.count() == 5 + 3 + 1
    report = service.prune()
    assert report.deleted["fact_versions"] == 4
    assert [v.value for v in service.fact_history(kept.pk)] == [3, 4]
    assert [v.action for v in service.fact_history(gone.pk)] == ["updated", "deleted"]


# ------------------------------------------------------------------ transfer and erasure


def test_export_import_keeps_versions_of_deleted_facts(service, user_factory):
    ada = user_factory("ada")
    gone = service.set_fact("city", "Porto", scope="user", user_id=ada.pk).fact
    service.set_fact("city", "Lisbon", scope="user", user_id=ada.pk)
    then = timezone.now()
    service.delete_fact(gone.pk)
    service.set_fact("tea", "oolong")
    before = list(FactHistory.objects.order_by("pk").values())
    out = io.StringIO()
    service.export_memories(out)
    service.clear_memories()
    assert not FactHistory.objects.exists()
    report = service.import_memories(io.StringIO(out.getvalue()))
    assert report.added["fact_version"] == 3  # Porto and Lisbon superseded, and the delete; tea's is its row
    assert list(FactHistory.objects.order_by("pk").values()) == before
    assert service.get_fact("city", user_id=ada.pk, as_of=then).value == "Lisbon"


def test_an_export_from_before_history_imports_and_starts_it(service):
    service.set_fact("tea", "oolong")
    out = io.StringIO()
    service.export_memories(out)
    lines = out.getvalue().splitlines()
    header = json.loads(lines[0])
    del header["counts"]["fact_version"]
    old = [json.dumps(header), *(line for line in lines[1:] if json.loads(line)["kind"] != "fact_version")]
    service.clear_memories()
    service.import_memories(io.StringIO("\n".join(old) + "\n"))
    fact = Fact.objects.get()
    [version] = service.fact_history(fact.pk)
    assert (version.action, version.value, version.valid_from) == ("created", "oolong", fact.updated_at)


def test_an_export_listing_current_states_as_versions_imports_to_the_same_history(service, user_factory):
    """Files written before a fact's current state moved onto its row list it as its latest version."""
    ada = user_factory("ada")
    episode = service.start_episode(agent_id=AGENT, user_id=ada.pk)
    service.set_fact("city", "Porto", scope="user", user_id=ada.pk, provenance="told")
    service.set_fact("city", "Lisbon", scope="user", user_id=ada.pk, provenance="moved")
    service.set_fact("city", "Lisbon", scope="user", user_id=ada.pk, source_episode_id=episode.pk, provenance="again")
    service.set_fact("tea", "oolong")
    before = [
        (v.fact_id, v.action, v.value, v.source_episode_id, v.provenance, v.valid_from)
        for v in FactHistory.objects.order_by("valid_from", "id")
    ]
    out = io.StringIO()
    service.export_memories(out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    header, rows = lines[0], lines[1:]
    columns = ("fact_id", "action", "key", "value", "fact_type", "scope", "user_id", "agent_id", "session_id")
    current = [
        {"kind": "fact_version", "id": 1000 + v.fact_id, **{c: getattr(v, c) for c in columns}}
        | {"confidence": v.confidence, "source_episode_id": v.source_episode_id, "provenance": v.provenance}
        | {"valid_from": v.valid_from.isoformat()}
        for v in FactHistory.objects.filter(current=True)
    ]
    old_rows = [{k: v for k, v in row.items() if not k.startswith("change_")} for row in rows] + current
    header["counts"]["fact_version"] += len(current)
    service.clear_memories()
    service.import_memories(io.StringIO("\n".join(json.dumps(r) for r in [header, *old_rows]) + "\n"))
    after = [
        (v.fact_id, v.action, v.value, v.source_episode_id, v.provenance, v.valid_from)
        for v in FactHistory.objects.order_by("valid_from", "id")
    ]
    assert after == before
    assert FactVersion.objects.count() == 2  # Porto and the first Lisbon: the latest of each fact is its row


def test_an_import_refuses_a_bad_version_naming_line_and_field(service):
    from memory.exceptions import ImportRejected

    service.set_fact("tea", "oolong")
    service.set_fact("tea", "green")
    out = io.StringIO()
    service.export_memories(out)
    lines = out.getvalue().splitlines()
    n = next(i for i, line in enumerate(lines) if json.loads(line).get("kind") == "fact_version")
    row = json.loads(lines[n])
    row["action"] = "vanished"
    lines[n] = json.dumps(row)
    service.clear_memories()
    with pytest.raises(ImportRejected) as raised:
        service.import_memories(io.StringIO("\n".join(lines) + "\n"))
    assert raised.value.errors[0][:2] == (n + 1, "action")
    assert not Fact.objects.exists() and not FactHistory.objects.exists()


def test_forgetting_a_person_deletes_their_history(service, user_factory):
    ada, bob = user_factory("ada"), user_factory("bob")
    gone = service.set_fact("diagnosis", "flu", scope="user", user_id=ada.pk).fact
    service.delete_fact(gone.pk)  # already deleted: its versions still name ada
    service.set_fact("city", "Porto", scope="user", user_id=ada.pk)
    service.set_fact("city", "Lisbon", scope="user", user_id=bob.pk)
    assert FactHistory.objects.filter(user=ada).count() == 3
    result = service.delete_users([ada.pk], cascade=True)
    assert result.cascaded["fact_versions"] == 3
    assert not FactHistory.objects.filter(scope_key=f"user:{ada.pk}").exists()
    assert FactHistory.objects.filter(user=bob).count() == 1
    assert not FactHistory.objects.filter(value="flu").exists()


def test_export_person_includes_their_history(service, user_factory):
    ada = user_factory("ada")
    gone = service.set_fact("city", "Porto", scope="user", user_id=ada.pk).fact
    service.delete_fact(gone.pk)
    out = io.StringIO()
    service.export_person(ada.pk, out)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["action"], r["value"]) for r in rows if r["kind"] == "fact_version"] == [
        ("created", "Porto"),
        ("deleted", "Porto"),
    ]
