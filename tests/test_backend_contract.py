"""The storage backend contract (memory/backends/interface.py), run against the configured database.

CI runs this file on SQLite and on PostgreSQL: a backend for another database must pass it too.
Rows are written through MemoryService (what users do); each test then asks the backend directly.
"""

import inspect
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone

from memory.backends import get_backend
from memory.backends.base import USER_OWNER_SQL, owner_terms
from memory.backends.interface import StorageBackend
from memory.backends.postgresql import PostgreSQLBackend
from memory.backends.sqlite import SQLiteBackend
from memory.domain.store_items import StorePut
from memory.models import Episode, Fact, Procedure, RecallDocument, Scope, StoreItem
from memory.rules.validation import Viewer

INTERFACE = [name for name, _ in inspect.getmembers(StorageBackend, inspect.isfunction) if not name.startswith("_")]


@pytest.fixture
def backend(db):
    return get_backend()


@pytest.mark.parametrize("backend_class", [SQLiteBackend, PostgreSQLBackend])
def test_every_backend_implements_the_whole_interface(backend_class):
    missing = [name for name in INTERFACE if not callable(getattr(backend_class, name, None))]
    assert not missing
    for name in INTERFACE:  # and takes the arguments the interface names
        wanted = list(inspect.signature(getattr(StorageBackend, name)).parameters)[1:]  # after self
        assert list(inspect.signature(getattr(backend_class, name)).parameters)[1:] == wanted, name


def test_the_configured_backend_is_a_storage_backend(backend):
    assert isinstance(backend, StorageBackend)
    assert len(INTERFACE) >= 20


def test_this_suite_exercises_every_method_of_the_interface():
    called = set(re.findall(r"\bbackend\.(\w+)\(", Path(__file__).read_text()))
    assert sorted(set(INTERFACE) - called) == []


def test_get_fact_returns_the_most_specific_visible_fact(backend, service, user_factory):
    ada = user_factory("ada")
    service.set_fact("tz", "UTC", scope=Scope.GLOBAL)
    service.set_fact("tz", "CET", scope=Scope.AGENT, agent_id="bot")
    service.set_fact("tz", "PST", scope=Scope.USER, user_id=ada.pk)
    assert backend.get_fact("tz", Viewer(agent_id="bot", user_id=ada.pk)).value == "PST"
    assert backend.get_fact("tz", Viewer(agent_id="bot")).value == "CET"
    assert backend.get_fact("tz", Viewer(agent_id="other")).value == "UTC"
    assert backend.get_fact("missing", Viewer()) is None


def test_pins_are_set_and_read_per_viewer_with_shadowing(backend, service, user_factory):
    ada = user_factory("ada")
    rule = service.set_fact("rule", "global rule", scope=Scope.GLOBAL).fact
    own = service.set_fact("rule", "bot rule", scope=Scope.AGENT, agent_id="bot").fact
    procedure = service.save_procedure("greet", agent_id="bot", content={"prompt": "hi"})
    assert backend.set_pinned(Fact, [rule.pk, own.pk], True) == 2
    assert backend.set_pinned(Fact, [rule.pk], True) == 0  # already pinned: nothing changed
    assert backend.set_pinned(Procedure, [procedure.pk], True) == 1
    assert [f.value for f in backend.pinned_facts(Viewer(agent_id="bot", user_id=ada.pk))] == ["bot rule"]
    assert [f.value for f in backend.pinned_facts(Viewer(agent_id="other"))] == ["global rule"]
    assert [p.name for p in backend.pinned_procedures("bot")] == ["greet"]
    assert backend.pinned_procedures("other") == []


def test_visible_facts_filter_order_and_shadow(backend, service, user_factory):
    ada = user_factory("ada")
    service.set_fact("drink", "tea", scope=Scope.GLOBAL, confidence=0.9)
    service.set_fact("drink", "coffee", scope=Scope.USER, user_id=ada.pk, confidence=0.2, fact_type="user_preference")
    service.set_fact("food", "plain rice", scope=Scope.GLOBAL, confidence=0.6)
    viewer = Viewer(user_id=ada.pk)
    by_key = backend.visible_facts(viewer)
    assert [(f.key, f.value) for f in by_key] == [("drink", "coffee"), ("food", "plain rice")]  # tea is shadowed
    best = backend.visible_facts(viewer, order="confidence", limit=10)
    assert [f.value for f in best] == ["plain rice", "coffee"]
    assert [f.value for f in backend.visible_facts(viewer, tokens=["rice"])] == ["plain rice"]
    assert [f.value for f in backend.visible_facts(viewer, min_confidence=0.5)] == ["plain rice"]
    assert [f.value for f in backend.visible_facts(viewer, fact_type="user_preference")] == ["coffee"]
    assert [f.value for f in backend.visible_facts(Viewer())] == ["tea", "plain rice"]


def test_insert_if_absent_owned_fact_and_update(backend, service, user_factory):
    ada = user_factory("ada")
    fact = Fact(key="k", value=1, scope=Scope.USER, user_id=ada.pk, search_text="k 1")
    assert backend.insert_fact_if_absent(fact) and fact.pk
    twin = Fact(key="k", value=2, scope=Scope.USER, user_id=ada.pk, search_text="k 2")
    assert backend.insert_fact_if_absent(twin) is False
    stored = backend.owned_fact(twin, lock=False)
    assert stored.pk == fact.pk and stored.value == 1
    backend.update_fact(fact.pk, {"value": 3, "times_confirmed": ("times_confirmed + %s", [2])})
    fact.refresh_from_db()
    assert fact.value == 3 and fact.times_confirmed == 2


def test_owned_facts_are_counted_per_owner_no_further_than_asked(backend, service, user_factory):
    ada = user_factory("ada")
    for key in ("a", "b", "c"):
        service.set_fact(key, 1, scope=Scope.USER, user_id=ada.pk)
    service.set_fact("a", 1, scope=Scope.AGENT, agent_id="bot")
    owner = f"user:{ada.pk}"
    assert backend.count_owned_facts(owner, 10) == 3
    assert backend.count_owned_facts(owner, 2) == 2
    assert backend.count_owned_facts("agent:bot", 10) == 1
    assert backend.count_owned_facts("agent:other", 10) == 0


def test_hold_people_answers_the_ids_that_still_exist(backend, service, user_factory):
    ada, bea, cy = user_factory("ada"), user_factory("bea"), user_factory("cy")
    service.delete_users([cy.pk], cascade=True)
    with transaction.atomic():
        assert backend.hold_people([bea.pk, ada.pk, ada.pk, cy.pk, 987654]) == {ada.pk, bea.pk}


def test_writes_by_a_merged_users_id_land_on_the_survivor(backend, service, user_factory):
    ada, bea = user_factory("ada"), user_factory("bea")
    service.merge_users(ada.pk, bea.pk)
    fact = Fact(key="k", value=1, scope=Scope.USER, user_id=ada.pk, search_text="k 1")
    assert backend.insert_fact_if_absent(fact)
    assert fact.user_id == bea.pk
    episode = Episode(user_id=ada.pk, agent_id="bot", started_at=Fact.objects.get(pk=fact.pk).created_at)
    backend.insert_episode(episode)
    assert episode.user_id == bea.pk and backend.episode_exists(episode.pk)
    assert [e.pk for e in backend.recent_episodes(None, ada.pk, 5)] == [episode.pk]
    assert not backend.episode_exists(episode.pk + 1000)


def test_an_episode_of_an_unknown_user_is_stored_without_one(backend, service):
    episode = Episode(user_id=987654, started_at=service.start_episode().started_at)
    backend.insert_episode(episode)
    assert episode.pk and episode.user_id is None


def test_matching_procedures_best_first(backend, service):
    good = service.save_procedure("refund", trigger_conditions={"goal_contains": ["refund"]})
    service.save_procedure("other", trigger_conditions={"goal_contains": ["ship"]})
    service.save_procedure("ctx", trigger_conditions={"context_has": ["order_id"]})
    service.record_procedure_use(good.pk, success=True)
    assert [p.name for p in backend.matching_procedures("a refund please", [], "", 5)] == ["refund"]
    assert "ctx" in [p.name for p in backend.matching_procedures("anything", ["order_id"], "", 5)]


def test_identify_statements(backend, service, user_factory):
    ada = user_factory("ada")
    service.link_identity(ada.pk, "email", "ada@example.org")
    service.set_fact("pet", "cat", scope=Scope.USER, user_id=ada.pk)
    service.start_episode(user_id=ada.pk)
    user, identities = backend.identities_of("email", "ada@example.org")
    assert user.pk == ada.pk and {i.channel for i in identities} >= {"email"}
    assert backend.identities_of("email", "nobody") == (None, [])
    before = user.total_conversations
    with transaction.atomic():
        backend.hold_user(ada.pk)
        backend.count_visit(ada.pk, ada.created_at, "Ada L.")
    assert backend.identities_of("email", "ada@example.org")[0].total_conversations == before + 1
    facts, total = backend.context_facts(ada.pk, 10)
    assert total == 1 and facts[0].key == "pet"
    episodes, total = backend.context_episodes(ada.pk, 10)
    assert total == 1 and len(episodes) == 1


def test_recall_statements_find_a_viewers_documents_only(backend, service, user_factory):
    ada, bea = user_factory("ada"), user_factory("bea")
    service.set_fact("hobby", "kayaking on the lake", scope=Scope.USER, user_id=ada.pk)
    service.set_fact("hobby", "kayaking in the sea", scope=Scope.USER, user_id=bea.pk)
    viewer = Viewer(user_id=ada.pk)
    owners = backend.recall_owners(viewer, owner_terms, USER_OWNER_SQL)
    keys = [owner for owner, *_ in owners]
    assert f"user:{ada.pk}" in keys and f"user:{bea.pk}" not in keys
    hits = backend.recall_keyword(["kayaking"], keys, 10)
    assert len(hits) == 1 and hits[0][1] > 0
    documents = backend.recall_documents([doc for doc, _ in hits], [(o, r) for o, r, *_ in owners], ["fact"], None)
    assert len(documents) == 1
    backend.optimize_recall_index()
    with transaction.atomic(), backend.bulk_load():
        service.set_fact("more", "x", scope=Scope.GLOBAL)
    backend.optimize()
    assert backend.get_fact("more", Viewer()).value == "x"


def test_rows_read_in_chunks_bring_stored_bytes_back_as_written_and_errors_as_djangos(db):
    """fetch_in_chunks (the vector index's loads): on PostgreSQL a cursor of its own with binary
    results; the bytes come back as stored, and a failing statement raises Django's DatabaseError
    (what the callers catch), which rolls back the atomic block around it as Django's cursor would."""
    from django.db import DatabaseError

    from memory.backends.rows import fetch_in_chunks
    from memory.models import RecallDocument

    blobs = [bytes(range(256)) * 6, b"\x00" * 1536, bytes(1536)]
    for i, blob in enumerate(blobs):
        Fact.objects.create(key=f"k{i}", value="v", scope=Scope.GLOBAL, search_text=f"k{i} v")
        RecallDocument.objects.filter(kind="fact", item_id=Fact.objects.get(key=f"k{i}").pk).update(embedding=blob)
    sql = "SELECT id, embedding FROM memory_recall_doc WHERE kind = %s ORDER BY id"
    chunks = list(fetch_in_chunks(sql, ["fact"], 2))
    assert [len(chunk) for chunk in chunks] == [2, 1]
    assert [bytes(row[1]) for chunk in chunks for row in chunk] == blobs
    with pytest.raises(DatabaseError), transaction.atomic():
        Fact.objects.create(key="gone", value="v", scope=Scope.GLOBAL, search_text="gone v")
        list(fetch_in_chunks("SELECT no_such_column FROM memory_recall_doc", [], 10))
    assert sorted(Fact.objects.values_list("key", flat=True)) == ["k0", "k1", "k2"]  # rolled back, usable


def test_hand_written_statements_bind_parameters_in_order_and_keep_literal_percent_signs(db):
    """fetch_rows passes parameters by name on SQLite: each %s still gets its own value in order, a
    literal % (in a LIKE pattern or written %%) stays a %, a wrong count fails as the driver's
    error, and the statements Django records show the values."""
    from django.db import DatabaseError, connection
    from django.test.utils import CaptureQueriesContext

    from memory.backends.rows import Columns, fetch_rows

    Fact.objects.create(key="50% off", value="v", scope=Scope.GLOBAL, search_text="50% off v")
    Fact.objects.create(key="full price", value="w", scope=Scope.AGENT, agent_id="a", search_text="full price w")
    columns = Columns([Fact._meta.get_field("key"), Fact._meta.get_field("value")])
    sql = (
        "SELECT f.\"key\", f.value FROM memory_fact f WHERE (f.\"key\" LIKE '%%\\%%%%' ESCAPE '\\' "
        'OR f."key" LIKE \'%%\' || %s) AND f.scope IN (%s, %s) ORDER BY f."key"'
    )
    with CaptureQueriesContext(connection) as captured:
        rows = fetch_rows(sql, ["price", "global", "agent"], columns)
    assert rows == [["50% off", "v"], ["full price", "w"]]
    assert "'price'" in captured.captured_queries[0]["sql"]
    assert fetch_rows(sql, ["off", "session", "global"], columns) == [["50% off", "v"]]
    if connection.vendor == "sqlite":  # Django's SQLite cursor keeps a lone % as it is
        assert fetch_rows("SELECT '5%' || %s", ["0"], Columns([])) == [["5%0"]]
    with pytest.raises(DatabaseError):
        fetch_rows(sql, ["price", "global"], columns)


def test_recall_neighbours_are_the_pieces_said_around_an_episode_in_its_session(backend, service, user_factory):
    ada = user_factory("ada")
    said = ["we met at the harbour", "the ferry left at noon", "it rained all afternoon", "we ate soup"]
    ids = [
        service.record_episode(
            started_at=timezone.now(), agent_id="bot", user_id=ada.pk, session_id="s1", summary=text, success=True
        ).pk
        for text in said
    ]
    service.record_episode(
        started_at=timezone.now(), agent_id="bot", user_id=ada.pk, session_id="s2", summary="elsewhere", success=True
    )
    docs = dict(RecallDocument.objects.filter(kind="episode", item_id__in=ids).values_list("item_id", "id"))
    session, around = backend.recall_neighbours([docs[ids[1]]])[docs[ids[1]]]
    assert session == "s1"
    # one before, one after, two before, two after: the first piece has nothing two before it
    assert around == [docs[ids[0]], docs[ids[2]], None, docs[ids[3]]]
    assert backend.recall_neighbours([]) == {}


def test_store_statements_read_live_items_by_key_and_under_a_namespace(backend, service):
    service.store_put_many(
        [
            StorePut(("docs", "en"), "a", {"lang": "en", "n": 1}),
            StorePut(("docs", "fr"), "b", {"lang": "fr", "n": 2}),
            StorePut(("docsx",), "c", {"lang": "en", "n": 1}),
            StorePut(("docs", "en"), "gone", {"lang": "en"}, ttl_minutes=1),
        ]
    )
    now = timezone.now()
    by_key = backend.store_rows_by_key([("docs.en", "a"), ("docs.fr", "b"), ("docs.en", "missing")], now)
    assert sorted((row[1], row[2]) for row in by_key) == [("docs.en", "a"), ("docs.fr", "b")]
    later = now + timedelta(minutes=5)  # the item with a one-minute TTL has expired by then
    assert [row[2] for row in backend.store_rows_by_key([("docs.en", "gone")], later)] == []
    under = backend.store_rows_under("docs", later, {}, None)
    assert sorted(row[2] for row in under) == ["a", "b"]  # not "docsx", not the expired item
    assert [row[2] for row in backend.store_rows_under("docs", later, {"lang": "en"}, 10)] == ["a"]
    assert [row[2] for row in backend.store_rows_under("", later, {"n": 1}, 10)] in (["a", "c"], ["c", "a"])
    scored = backend.store_rows_under("docs", later, {"lang": "fr"}, 10, scored=True)
    assert [row[2] for row in scored] == ["b"] and len(scored[0]) == len(by_key[0]) + 2  # with text and vector
    assert sorted(backend.store_namespace_names("docs", now)) == ["docs.en", "docs.fr"]  # not "docsx"
    assert sorted(backend.store_namespace_names("", later)) == ["docs.en", "docs.fr", "docsx"]


def test_store_upsert_inserts_then_updates_in_place_keeping_created_at(backend, service):
    service.store_put_many([StorePut(("docs", "en"), "a", {"n": 1})])
    first = StoreItem.objects.get(namespace="docs.en", key="a")
    row = {f.attname: getattr(first, f.attname) for f in StoreItem._meta.concrete_fields if not f.primary_key}
    new = {**row, "key": "b", "value": {"n": 2}}
    with transaction.atomic():
        ids = backend.store_upsert([{**row, "value": {"n": 3}, "created_at": timezone.now()}, new])
    assert ids[("docs.en", "a")] == first.pk  # updated in place, not a second row
    again = StoreItem.objects.get(pk=first.pk)
    assert again.value == {"n": 3} and again.created_at == first.created_at
    assert StoreItem.objects.get(pk=ids[("docs.en", "b")]).value == {"n": 2}


def test_store_field_equality_keeps_every_equal_item_and_only_those_when_it_says_exact(backend, service):
    values = ["en", 1, 2.5, ["en"], {"a": 1}, '{"a":1}', "[1]", [1]]
    service.store_put_many([StorePut(("eq",), f"k{i}", {"v": value}) for i, value in enumerate(values)])
    now = timezone.now()
    for wanted in ("en", 1, 2.5, '{"a":1}', "[1]"):
        condition, _ = backend.store_field_equals("v", wanted)
        assert isinstance(condition, str) and condition.count("%s") == 1
        kept = {row[2] for row in backend.store_rows_under("eq", now, {"v": wanted}, None)}
        equal = {f"k{i}" for i, value in enumerate(values) if value == wanted and type(value) is type(wanted)}
        assert kept >= equal, wanted  # never loses an equal item (the service re-checks the rest)
        if backend.store_equality_is_exact(wanted):
            assert kept == equal, wanted


@pytest.mark.django_db(transaction=True)
def test_after_a_deletion_commits_the_database_lets_go_of_its_rows(backend, service, user_factory):
    ada = user_factory("ada")
    service.set_fact("boat", "a red kayak", scope=Scope.USER, user_id=ada.pk)
    service.delete_users([ada.pk], cascade=True)
    refreshed, problems = backend.scrub_after_erasure(["memory_fact", "no_such_table"])
    assert problems == [] and set(refreshed) <= {"memory_fact"}  # a table that does not exist is passed over
    assert isinstance(backend.reclaim_space(), int)  # outside a transaction: done now, pages counted
    with transaction.atomic():
        freed = backend.reclaim_space()  # inside one: at its commit (None), or nothing to do (0)
    assert freed in (None, 0)


@pytest.mark.django_db(transaction=True)
def test_a_snapshot_reads_what_was_committed_before_it(backend, service):
    service.set_fact("tz", "UTC", scope=Scope.GLOBAL)
    with transaction.atomic():
        backend.begin_snapshot()
        assert backend.get_fact("tz", Viewer()).value == "UTC"
        assert [f.key for f in backend.visible_facts(Viewer())] == ["tz"]
