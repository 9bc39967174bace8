"""MemoryService.recall: visibility and shadowing in every mode, index upkeep, modes, events, query counts.

Vector and hybrid modes run with LangChain's DeterministicFakeEmbedding (a hash of the text seeds
each vector: equal texts, equal vectors), so they need no model; tests/test_recall_local_model.py
covers the real local model when the `embeddings` extra is installed.
"""

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.utils import timezone

from memory.backends import get_backend
from memory.embedding.embedder import EmbeddingModelChanged, to_blob
from memory.exceptions import InvalidMemoryArgument, MemoryNotFound
from memory.models import (
    EmbeddingModelRecord,
    Episode,
    Fact,
    MemoryUser,
    Procedure,
    RecallDocument,
    RecallEvent,
    RecallScope,
)
from memory.recall.events import recall_log
from memory.recall.vectors import reset_vector_index

FAKE = {"EMBEDDINGS": "langchain_core.embeddings.DeterministicFakeEmbedding", "EMBEDDINGS_OPTIONS": {"size": 64}}
MODES = ["keyword", "vector", "hybrid"]


@pytest.fixture
def fake_embedder(settings):
    """Hybrid recall with a deterministic fake embedder (fresh vector index and model check)."""
    settings.MEMORY = {**getattr(settings, "MEMORY", {}), **FAKE}
    reset_vector_index()
    yield
    reset_vector_index()


@pytest.fixture(params=MODES)
def mode(request):
    if request.param != "keyword":
        request.getfixturevalue("fake_embedder")
    else:
        request.getfixturevalue("keyword_only")
    return request.param


@pytest.fixture(autouse=True)
def _recall_log_does_not_leak(db):
    recall_log.flush()
    yield
    recall_log.flush()


def recalled(service, query, *, mode, limit=50, **viewer):
    return [(h.kind, h.text) for h in service.recall(query, mode=mode, limit=limit, **viewer)]


def fts_rows(word):
    """Document ids the keyword index holds for `word` (SQLite FTS5, once caught up with its delta, or
    PostgreSQL tsvector)."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            get_backend().catch_up_recall_index()
            cursor.execute("SELECT rowid FROM memory_recall_fts WHERE memory_recall_fts MATCH %s", [f'text : "{word}"'])
        else:
            cursor.execute("SELECT id FROM memory_recall_doc WHERE tsv @@ plainto_tsquery('english', %s)", [word])
        return sorted(r[0] for r in cursor.fetchall())


# ------------------------------------------------------------------ what recall finds


def test_recall_finds_facts_episodes_and_procedures(service, user_factory, keyword_only):
    ada = user_factory("ada")
    service.set_fact("favourite_drink", "jasmine tea", scope="user", user_id=ada.pk, fact_type="user_preference")
    episode = service.start_episode(agent_id="bot", user_id=ada.pk, session_id="s1")
    service.add_message(episode.pk, "user", "my kettle broke while brewing jasmine tea")
    service.complete_episode(episode.pk, success=True, summary="helped with a broken kettle")
    service.save_procedure("brew", description="How to brew jasmine tea", content={"steps": ["heat", "steep"]})

    result = service.recall("jasmine tea", agent_id="bot", user_id=ada.pk)
    assert result.mode == "keyword"
    by_kind = {h.kind: h for h in result}
    assert set(by_kind) == {"fact", "episode", "procedure"}
    assert by_kind["fact"].text == "favourite_drink: jasmine tea"
    assert by_kind["fact"].item.key == "favourite_drink"
    assert "kettle broke" in by_kind["episode"].text and by_kind["episode"].item.pk == episode.pk
    assert by_kind["procedure"].item.name == "brew"
    assert all(h.score > 0 for h in result)
    assert [h.score for h in result] == sorted((h.score for h in result), reverse=True)
    as_dict = by_kind["fact"].as_dict()
    assert as_dict["kind"] == "fact" and as_dict["item"]["value"] == "jasmine tea"

    only_facts = service.recall("jasmine tea", agent_id="bot", user_id=ada.pk, types=["facts"])
    assert [h.kind for h in only_facts] == ["fact"]


def test_keyword_recall_ranks_the_better_match_first(service, keyword_only):
    service.set_fact("a", "the harbour ferry leaves at noon", scope="agent", agent_id="bot")
    service.set_fact(
        "b", "the ferry timetable changes in winter, ferry tickets cost more", scope="agent", agent_id="bot"
    )
    service.set_fact("c", "lunch is at noon", scope="agent", agent_id="bot")
    hits = service.recall("ferry timetable", agent_id="bot")
    assert [h.item.key for h in hits] == ["b", "a"]


def test_stemming_matches_word_forms(service, keyword_only):
    service.set_fact("trip", "we were hiking in the mountains", scope="global")
    assert [h.item.key for h in service.recall("hikes mountain")] == ["trip"]


# ------------------------------------------------------------------ isolation, in every mode


def _fill_owners(service, user_factory):
    u1, u2 = user_factory("u1"), user_factory("u2")
    service.set_fact("k_global", "colour global", scope="global")
    service.set_fact("k_a1", "colour agent one", scope="agent", agent_id="a1")
    service.set_fact("k_a2", "colour agent two", scope="agent", agent_id="a2")
    service.set_fact("k_u1", "colour user one", scope="user", user_id=u1.pk)
    service.set_fact("k_u2", "colour user two", scope="user", user_id=u2.pk)
    service.set_fact("k_s1", "colour session one", scope="session", session_id="s1")
    service.set_fact("k_s2", "colour session two", scope="session", session_id="s2")
    return u1, u2


def _keys(service, mode, **viewer):
    return sorted(h.item.key for h in service.recall("colour", mode=mode, types=["facts"], limit=50, **viewer))


def test_a_viewer_recalls_global_and_its_own_owners_only(service, user_factory, mode):
    u1, u2 = _fill_owners(service, user_factory)
    assert _keys(service, mode, agent_id="a1", user_id=u1.pk, session_id="s1") == ["k_a1", "k_global", "k_s1", "k_u1"]
    assert _keys(service, mode, agent_id="a2", user_id=u2.pk, session_id="s2") == ["k_a2", "k_global", "k_s2", "k_u2"]
    assert _keys(service, mode, agent_id="a1") == ["k_a1", "k_global"]
    assert _keys(service, mode, user_id=u2.pk) == ["k_global", "k_u2"]
    assert _keys(service, mode, session_id="s2") == ["k_global", "k_s2"]
    assert _keys(service, mode) == ["k_global"]


def test_more_specific_fact_hides_the_less_specific_one(service, user_factory, mode):
    u = user_factory()
    service.set_fact("city", "colour city Lisbon", scope="global", confidence=1.0)
    service.set_fact("city", "colour city Porto", scope="agent", agent_id="bot", confidence=0.2)
    service.set_fact("city", "colour city Faro", scope="user", user_id=u.pk, confidence=0.1)
    texts = lambda **v: [h.text for h in service.recall("colour city", mode=mode, types=["facts"], **v)]  # noqa: E731
    assert texts() == ["city: colour city Lisbon"]
    assert texts(agent_id="bot") == ["city: colour city Porto"]
    assert texts(agent_id="bot", user_id=u.pk) == ["city: colour city Faro"]
    # The hiding fact is below min_confidence: it is left out and still hides the others.
    assert service.recall("colour city", mode=mode, agent_id="bot", user_id=u.pk, min_confidence=0.5).hits == []


def test_episode_visibility_follows_agent_and_user(service, user_factory, mode):
    u1, u2 = user_factory("u1"), user_factory("u2")

    def episode(text, **owner):
        e = service.start_episode(**owner)
        service.add_message(e.pk, "user", f"colour {text}")
        return e

    episode("a1 with u1", agent_id="a1", user_id=u1.pk)
    episode("a1 alone", agent_id="a1")
    episode("u1 alone", user_id=u1.pk)
    episode("a2 with u1", agent_id="a2", user_id=u1.pk)
    episode("session only", session_id="s9")
    episode("nobody's")

    def seen(**viewer):
        return sorted(
            h.text.split("colour ")[1] for h in service.recall("colour", mode=mode, types=["episodes"], **viewer)
        )

    # A person sees only their own episodes: one without a person may hold anyone's words.
    assert seen(agent_id="a1", user_id=u1.pk) == ["a1 with u1", "u1 alone"]
    assert seen(agent_id="a1", user_id=u2.pk) == []
    assert seen(agent_id="a2", user_id=u1.pk) == ["a2 with u1", "u1 alone"]
    assert seen(agent_id="a1") == ["a1 alone", "nobody's"]
    assert seen(session_id="s9") == ["nobody's", "session only"]
    assert seen() == ["nobody's"]


def test_procedures_shared_own_and_inactive(service, mode):
    service.save_procedure("greet", description="colour greeting shared")
    service.save_procedure("greet", agent_id="bot", description="colour greeting for bot")
    retired = service.save_procedure("old", description="colour retired procedure")
    service.deactivate_procedure(retired.pk)

    def seen(**viewer):
        return sorted(h.item.description for h in service.recall("colour", mode=mode, types=["procedures"], **viewer))

    assert seen(agent_id="bot") == ["colour greeting for bot"]
    assert seen(agent_id="other") == ["colour greeting shared"]


def test_recall_follows_merged_users(service, user_factory, mode):
    old, new = user_factory("old"), user_factory("new")
    service.set_fact("pet", "colour cat named Tom", scope="user", user_id=old.pk)
    service.merge_users(old.pk, new.pk)
    assert [h.item.key for h in service.recall("colour cat", mode=mode, user_id=old.pk)] == ["pet"]
    assert [h.item.key for h in service.recall("colour cat", mode=mode, user_id=new.pk)] == ["pet"]
    assert RecallDocument.objects.get(kind="fact").owner == f"user:{new.pk}"


# ------------------------------------------------------------------ index upkeep


def test_updating_a_fact_updates_both_indexes(service, fake_embedder):
    write = service.set_fact("drink", "espresso", scope="agent", agent_id="bot")
    doc = RecallDocument.objects.get(kind="fact", item_id=write.fact.pk)
    first_vector = bytes(doc.embedding)
    assert doc.text == "world knowledge drink espresso"
    assert fts_rows("espresso") == [doc.pk]

    service.set_fact("drink", "matcha", scope="agent", agent_id="bot")
    doc.refresh_from_db()
    assert fts_rows("espresso") == [] and fts_rows("matcha") == [doc.pk]
    assert doc.embedding is not None and bytes(doc.embedding) != first_vector
    assert [
        h.item.key for h in service.recall("world knowledge drink matcha", agent_id="bot", mode="vector", limit=1)
    ] == ["drink"]
    assert service.recall("espresso", agent_id="bot", mode="keyword").hits == []


def test_an_edit_moving_a_fact_to_another_owner_with_a_new_text_moves_its_document(service, fake_embedder):
    """Owner and text changed in one write (the admin can): the document moves, the old owner counts
    its vector as removed, and only the new owner recalls the new text."""
    fact = service.set_fact("drink", "espresso", scope="agent", agent_id="bot").fact
    assert service.recall("espresso", agent_id="bot", mode="vector").hits  # index warmed
    removed_before = RecallScope.objects.get(owner="agent:bot").removed

    Fact.objects.filter(pk=fact.pk).update(agent_id="barista", value="matcha", search_text="drink matcha")

    doc = RecallDocument.objects.get(kind="fact", item_id=fact.pk)
    assert (doc.owner, doc.shadow_key, doc.text) == ("agent:barista", "drink", "world knowledge drink matcha")
    assert doc.embedding is None  # the text changed: embedded again by `memory reindex --missing`
    assert RecallScope.objects.get(owner="agent:bot").removed == removed_before + 1
    assert [h.item.key for h in service.recall("matcha", agent_id="barista", mode="keyword")] == ["drink"]
    assert service.recall("matcha", agent_id="bot", mode="keyword").hits == []
    assert service.recall("espresso", agent_id="bot", mode="keyword").hits == []


def test_a_value_change_leaves_the_document_with_its_owner(service, keyword_only):
    fact = service.set_fact("drink", "espresso", scope="agent", agent_id="bot").fact
    service.set_fact("drink", "matcha", scope="agent", agent_id="bot")
    service.set_fact("drink", "matcha", scope="agent", agent_id="bot")  # confirmed
    doc = RecallDocument.objects.get(kind="fact", item_id=fact.pk)
    assert (doc.owner, doc.shadow_key, doc.text) == ("agent:bot", "drink", "world knowledge drink matcha")
    assert doc.importance == Fact.objects.get(pk=fact.pk).confidence
    assert [h.item.key for h in service.recall("matcha", agent_id="bot", mode="keyword")] == ["drink"]


def test_deleting_items_removes_them_from_both_indexes(service, user_factory, fake_embedder):
    u = user_factory()
    fact = service.set_fact("drink", "espresso", scope="agent", agent_id="bot").fact
    episode = service.start_episode(agent_id="bot", user_id=u.pk)
    service.add_message(episode.pk, "user", "espresso please")
    procedure = service.save_procedure("coffee", description="espresso machine")
    assert service.recall("espresso", agent_id="bot", user_id=u.pk, mode="vector").hits  # index warmed
    removed_before = RecallScope.objects.get(owner="agent:bot").removed

    service.delete_fact(fact.pk)
    Procedure.objects.filter(pk=procedure.pk).delete()
    MemoryUser.objects.filter(pk=u.pk).delete()  # cascades to the user's episodes

    assert not Episode.objects.filter(pk=episode.pk).exists()
    assert RecallDocument.objects.count() == 0
    assert fts_rows("espresso") == []
    assert RecallScope.objects.get(owner="agent:bot").removed == removed_before + 1
    for mode in MODES:
        assert service.recall("espresso", agent_id="bot", mode=mode).hits == []
        with pytest.raises(MemoryNotFound):  # the deleted user recalls nothing, and logs nothing
            service.recall("espresso", agent_id="bot", user_id=u.pk, mode=mode)


def test_episode_and_procedure_edits_update_both_indexes(service, fake_embedder):
    episode = service.start_episode(agent_id="bot")
    service.add_message(episode.pk, "user", "the invoice is late")
    doc = RecallDocument.objects.get(kind="episode")
    first = bytes(doc.embedding)
    service.add_message(episode.pk, "assistant", "I will resend the receipt")
    service.complete_episode(episode.pk, success=True, summary="resent a receipt")
    doc.refresh_from_db()
    started = Episode.objects.get(pk=episode.pk).started_at.astimezone(UTC)  # the date first (migration 0019)
    assert doc.text == (
        f"{started.day} {started:%B %Y}\nresent a receipt\nuser: the invoice is late\nassistant: I will resend the receipt"
    )
    assert bytes(doc.embedding) != first
    assert fts_rows("receipt") == [doc.pk]

    service.save_procedure("billing", description="send invoices")
    service.save_procedure("billing", description="send statements")
    pdoc = RecallDocument.objects.get(kind="procedure")
    assert "statements" in pdoc.text and fts_rows("invoices") == [doc.pk]
    assert pdoc.embedding is not None


def test_a_recorded_run_is_embedded_in_its_own_transaction(service, fake_embedder):
    # record_episode is how workflow runs store their episode: it must be found by vector too.
    started = timezone.now()
    episode = service.record_episode(
        started_at=started,
        agent_id="bot",
        success=True,
        summary="booked a table for two",
        conversation=[{"role": "user", "content": "book a table"}],
    )
    doc = RecallDocument.objects.get(kind="episode", item_id=episode.pk)
    assert doc.embedding is not None
    hits = service.recall("booked a table for two", agent_id="bot", types=("episodes",), mode="vector", limit=1)
    assert [h.id for h in hits] == [episode.pk]


def test_a_write_outside_the_service_clears_the_stale_vector(service, fake_embedder):
    fact = service.set_fact("drink", "espresso", scope="global").fact
    fact.value = "lemonade"
    fact.save()  # as the admin does
    doc = RecallDocument.objects.get(kind="fact")
    assert doc.text.endswith("lemonade") and doc.embedding is None
    assert [h.item.key for h in service.recall("lemonade", mode="keyword")] == ["drink"]
    assert service.reindex_recall(missing_only=True) == 1
    doc.refresh_from_db()
    assert doc.embedding is not None


def test_a_new_item_is_recalled_by_vector_without_a_restart(service, fake_embedder):
    service.set_fact("a", "first text", scope="global")
    assert [h.item.key for h in service.recall("world knowledge a first text", mode="vector", limit=1)] == ["a"]
    service.set_fact("b", "second text", scope="global")
    assert [h.item.key for h in service.recall("world knowledge b second text", mode="vector", limit=1)] == ["b"]
    service.set_fact("b", "third text", scope="global")
    assert [h.item.key for h in service.recall("world knowledge b third text", mode="vector", limit=1)] == ["b"]
    hits = service.recall("world knowledge b second text", mode="vector", limit=5)
    assert all(h.vector_score < 0.99 for h in hits)  # the old vector of b is gone


def test_another_processes_write_is_seen_through_the_generation(service, fake_embedder):
    """A write this process did not make (another process, or SQL) reaches its index via the generation."""
    fact = service.set_fact("a", "alpha", scope="global").fact
    service.recall("alpha", mode="vector")  # loads the index
    vector = bytes(RecallDocument.objects.get(kind="fact").embedding)
    other = service.set_fact("b", "beta", scope="global").fact
    # Give b a's vector behind the service's back, as another process's writes would look.
    RecallDocument.objects.filter(kind="fact", item_id=other.pk).update(embedding=vector)
    hits = service.recall("world knowledge a alpha", mode="vector", limit=2)
    assert sorted(h.item.key for h in hits) == ["a", "b"] and all(h.vector_score > 0.99 for h in hits)
    assert fact.pk != other.pk


def test_a_recall_that_read_an_older_generation_does_not_rebuild_the_index(service, fake_embedder):
    """Two requests of a process recall at once: the one that read its generations first syncs after the
    other has loaded newer ones. Its older generation is a stale read, not a restored database: the
    index keeps what it has instead of reloading the owner (at a million documents that took 20 s)."""
    from memory.embedding.embedder import get_embedder
    from memory.models import RecallScope
    from memory.recall.vectors import get_vector_index

    service.set_fact("a", "alpha", scope="global")
    before = RecallScope.objects.get(owner="global")
    service.set_fact("b", "beta", scope="global")
    service.recall("alpha", mode="vector")  # loads the index at the newer generation
    index = get_vector_index(get_embedder().dimension)
    matrix = index.owners["global"]
    assert index.sync({"global": (before.generation, before.removed)}) == 0  # the late reader's sync
    assert index.owners["global"] is matrix and matrix.size == 2

    # The database's counters really went back (restored, rebuilt): that owner is loaded afresh.
    RecallScope.objects.filter(owner="global").update(generation=before.generation)
    RecallDocument.objects.filter(kind="fact", item_id=service.get_fact("b").pk).delete()
    assert index.sync({"global": (before.generation, before.removed)}) == 1
    assert set(index.owners["global"].row_of) == set(RecallDocument.objects.values_list("id", flat=True))


def test_owners_behind_by_different_generations_load_together_each_its_own_new_documents(service, fake_embedder):
    """One sync of several owners (a recall's viewer, the embedding worker's batch) loads them in one
    statement: each owner gets exactly the documents stamped after what the index has of it."""
    from memory.embedding.embedder import get_embedder
    from memory.models import RecallScope
    from memory.recall.vectors import VectorIndex

    user = MemoryUser.objects.create(canonical_id="t:1")

    def states():
        return {o: (g, r) for o, g, r in RecallScope.objects.values_list("owner", "generation", "removed")}

    def doc_ids(owner):
        return set(RecallDocument.objects.filter(owner=owner).values_list("id", flat=True))

    service.set_fact("a", "alpha", scope="global")
    service.set_fact("b", "beta", scope="agent", agent_id="helper")
    index = VectorIndex(get_embedder().dimension)  # not the process's, which the writes' links have synced
    assert index.sync(states()) == 2
    service.set_fact("c", "gamma", scope="global")
    for key in ("d", "e", "f"):
        service.set_fact(key, key * 3, scope="user", user_id=user.pk)  # a new owner
    b = service.set_fact("b", "beta changed", scope="agent", agent_id="helper").fact  # a loaded document's new vector
    assert index.sync(states()) == 5
    for owner in states():
        matrix = index.owners[owner]
        assert set(matrix.row_of) == doc_ids(owner) and matrix.size - matrix.stale == len(doc_ids(owner))
    [(hit, cosine)] = index.search(list(states()), get_embedder().query("world knowledge b beta changed"), 1)
    assert hit == RecallDocument.objects.get(kind="fact", item_id=b.pk).pk and cosine > 0.99
    assert index.sync(states()) == 0  # all caught up: nothing read


def test_model_change_is_refused_until_reindexed(service, fake_embedder, settings):
    service.set_fact("drink", "espresso", scope="global")
    record = EmbeddingModelRecord.objects.get()
    assert record.dimension == 64 and "DeterministicFakeEmbedding" in record.model

    settings.MEMORY = {**settings.MEMORY, "EMBEDDINGS_OPTIONS": {"size": 32}}
    with pytest.raises(EmbeddingModelChanged, match="memory reindex"):
        service.recall("espresso")
    service.set_fact("snack", "biscuit", scope="global")  # writes go on, without a vector
    assert RecallDocument.objects.get(shadow_key="snack").embedding is None
    assert service.recall("espresso", mode="keyword").hits

    assert service.reindex_recall() == 2
    assert (EmbeddingModelRecord.objects.get().dimension, EmbeddingModelRecord.objects.count()) == (32, 1)
    assert [h.item.key for h in service.recall("world knowledge snack biscuit", mode="vector", limit=1)] == ["snack"]


def test_backfill_covers_items_written_before_the_index(service):
    """The migration indexes existing rows; the triggers cover every row since: no item lacks a document."""
    service.set_fact("a", "x", scope="global")
    service.save_procedure("p")
    service.start_episode(agent_id="bot")
    assert RecallDocument.objects.count() == Fact.objects.count() + Procedure.objects.count() + Episode.objects.count()


# ------------------------------------------------------------------ modes, log, queries, arguments


def test_keyword_only_mode(service, keyword_only):
    service.set_fact("drink", "espresso", scope="global")
    assert service.recall_mode() == "keyword-only"
    assert service.recall("espresso").mode == "keyword"
    assert RecallDocument.objects.get().embedding is None
    with pytest.raises(InvalidMemoryArgument) as err:
        service.recall("espresso", mode="hybrid")
    assert err.value.field == "mode"


def test_recall_events_and_reference_counts_are_buffered(service, keyword_only, capture_data_queries):
    service.set_fact("drink", "espresso", scope="global")
    service.set_fact("snack", "espresso biscuit", scope="global")
    get_backend().catch_up_recall_index()  # else this recall moves the new facts into the keyword index first
    with capture_data_queries() as q:
        hits = service.recall("espresso biscuit", agent_id="bot")
    assert not any(s.lstrip().upper().startswith(("INSERT", "UPDATE")) for s in q.data), q.data
    assert RecallEvent.objects.count() == 0
    assert service.flush_recall_log() == 2
    events = list(RecallEvent.objects.order_by("rank"))
    assert [(e.kind, e.item_id, e.rank, e.agent_id, e.query, e.mode) for e in events] == [
        ("fact", hits[0].id, 1, "bot", "espresso biscuit", "keyword"),
        ("fact", hits[1].id, 2, "bot", "espresso biscuit", "keyword"),
    ]
    assert sorted(RecallDocument.objects.values_list("reference_count", flat=True)) == [1, 1]
    service.flush_access_counts()
    assert sorted(Fact.objects.values_list("access_count", flat=True)) == [1, 1]


def test_recall_log_flushes_when_enough_hits_are_pending(service, keyword_only, settings):
    settings.MEMORY = {**settings.MEMORY, "RECALL_FLUSH_PENDING": 3}
    for i in range(3):
        service.set_fact(f"k{i}", "espresso", scope="global")
    service.recall("espresso")
    assert RecallEvent.objects.count() == 3


def test_recall_query_count_does_not_grow_with_hits(service, user_factory, django_assert_max_num_queries, keyword_only):
    u = user_factory()
    for i in range(30):
        service.set_fact(f"k{i}", f"espresso {i}", scope="user", user_id=u.pk)
        e = service.start_episode(agent_id="bot", user_id=u.pk, session_id="s")
        service.add_message(e.pk, "user", f"espresso order {i}")
    service.save_procedure("brew", description="espresso")
    service.recall("espresso", agent_id="bot", user_id=u.pk)  # index statistics are cached for minutes
    # owners, keyword, candidates, neighbours, one per kind for the items
    with django_assert_max_num_queries(7):
        hits = service.recall("espresso", agent_id="bot", user_id=u.pk, limit=50)
    assert len(hits) == 50


def test_hybrid_recall_query_count(service, fake_embedder, django_assert_max_num_queries):
    for i in range(20):
        service.set_fact(f"k{i}", f"espresso {i}", scope="global")
    service.recall("espresso")  # loads the vector index (and caches index statistics)
    with django_assert_max_num_queries(5):  # owners+generations, keyword, session neighbours, candidates, facts
        assert len(service.recall("espresso", limit=20)) == 20


def test_a_hybrid_fact_write_adds_two_statements(service, fake_embedder, capture_data_queries, settings):
    # Inline embedding (EMBED_ON_WRITE "inline") also links the memory graph in the writer; the
    # embedding worker does that after the commit (tests/test_relations.py), so leave it out here.
    settings.MEMORY = {**settings.MEMORY, "RELATIONS": {"SIMILAR": False}}
    service.set_fact("warm", "up", scope="global")  # the model check happens once per process
    with capture_data_queries() as q:
        assert service.set_fact("city", "Porto", scope="agent", agent_id="bot").action == "created"
    # the upsert's two (a create keeps no history row), then read the document's text, (PostgreSQL:
    # hold its row, memory/backends/rows.py held_rows; SQLite's one writer needs no hold), store its vector
    assert len(q.data) == (5 if connection.vendor == "postgresql" else 4), q.data


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"query": ""}, "query"),
        ({"query": "   "}, "query"),
        ({"query": 42}, "query"),
        ({"query": "x" * 5000}, "query"),
        ({"types": ["facts", "gossip"]}, "types"),
        ({"types": []}, "types"),
        ({"limit": 0}, "limit"),
        ({"limit": 1000}, "limit"),
        ({"min_confidence": 1.5}, "min_confidence"),
        ({"mode": "psychic"}, "mode"),
        ({"user_id": -3}, "user_id"),
        ({"agent_id": 7}, "agent_id"),
    ],
)
def test_bad_arguments_name_the_field_and_record_nothing(service, keyword_only, kwargs, field):
    service.set_fact("drink", "espresso", scope="global")
    args = {"query": "espresso", **kwargs}
    query = args.pop("query")
    with pytest.raises(InvalidMemoryArgument) as err:
        service.recall(query, **args)
    assert err.value.field == field
    assert recall_log.pending == 0


@pytest.mark.parametrize("join_share", [0.0, 2.0])
def test_both_keyword_plans_find_the_same(service, user_factory, keyword_only, monkeypatch, join_share):
    """SQLite picks a keyword plan from index statistics (owner markers vs a join); both are exact."""
    from memory.backends import sqlite

    monkeypatch.setattr(sqlite, "_RECALL_JOIN_SHARE", join_share)
    u1, u2 = _fill_owners(service, user_factory)
    for i in range(20):
        service.set_fact(f"more_{i}", f"colour extra {i}", scope="agent", agent_id="a2")
    assert _keys(service, "keyword", agent_id="a1", user_id=u1.pk, session_id="s1") == [
        "k_a1",
        "k_global",
        "k_s1",
        "k_u1",
    ]


def test_session_neighbours_lift_the_answer_to_a_question(service, keyword_only, settings):
    """A turn that answers without repeating the question's words is found through its neighbour,
    and ranks above the turn that only asked (a bare question is weak evidence)."""
    turns = [
        ("Ann", "what did you think of the lighthouse museum?"),
        ("Bob", "honestly it was the best afternoon of my summer"),
        ("Ann", "did you cook anything this week?"),
        ("Bob", "just pasta"),
    ]
    ids = []
    for speaker, text in turns:
        e = service.start_episode(agent_id="bot", session_id="chat-1")
        service.add_message(e.pk, speaker, text)
        ids.append(e.pk)
    hits = service.recall("lighthouse museum", agent_id="bot", types=["episodes"])
    assert [h.id for h in hits][:2] == [ids[1], ids[0]]

    settings.MEMORY = {**settings.MEMORY, "RECALL_BARE_QUESTION_WEIGHT": 1.0}  # asking counts in full
    hits = service.recall("lighthouse museum", agent_id="bot", types=["episodes"])
    assert [h.id for h in hits][:2] == [ids[0], ids[1]]


def test_an_episode_counts_by_the_share_of_it_that_asks(service, keyword_only):
    """recall_documents gives each episode the share of its sentences that are questions (an unended
    last sentence counts as one): what is asked is weak evidence of what is so; facts ask nothing."""
    texts = {
        "bare": "did you visit the lighthouse museum?",
        "half": "Wow, congrats on the lighthouse museum! How did it go?",
        "states": "We visited the lighthouse museum. It was great!",
        "unended": "How was the lighthouse museum? loved the pics",
    }
    ids = {}
    for name, text in texts.items():
        e = service.start_episode(agent_id="bot", session_id=name)
        service.add_message(e.pk, "Ann", text)
        ids[name] = RecallDocument.objects.get(kind="episode", item_id=e.pk).pk
    service.set_fact("museum", "which museum? the lighthouse one", scope="agent", agent_id="bot")
    fact = RecallDocument.objects.get(kind="fact").pk
    backend = get_backend()
    rows = backend.recall_documents([*ids.values(), fact], [("agent:bot", 1)], ["episode", "fact"], None)
    asking = {name: rows[doc][6] for name, doc in ids.items()}
    assert asking == {"bare": 1.0, "half": 0.5, "states": 0.0, "unended": 0.5}
    assert rows[fact][6] == 0.0


def test_what_a_question_gives_up_goes_to_its_answer(service, keyword_only, settings):
    """A turn that half asks keeps 1 - (1 - q) / 2 of its relevance (q = RECALL_BARE_QUESTION_WEIGHT);
    the turn after it, which shares no word with the question, gets the rest: (1 - q) / 2. Context
    weights are off here, so nothing else lifts the answer."""
    settings.MEMORY = {
        **settings.MEMORY,
        "RECALL_CONTEXT_WEIGHTS": (0, 0, 0, 0),
        "RECALL_SESSION_WEIGHT": 0,
        "RECALL_LENGTH_EXPONENT": 0,
    }
    ids = []
    for speaker, text in [
        ("Ann", "I love old buildings. Did you see the lighthouse museum?"),
        ("Bob", "honestly it was the best afternoon of my summer"),
        ("Ann", "what did you cook this week?"),
        ("Bob", "just pasta"),
    ]:
        e = service.start_episode(agent_id="bot", session_id="chat-1")
        service.add_message(e.pk, speaker, text)
        ids.append(e.pk)
    hits = service.recall("lighthouse museum", agent_id="bot", types=["episodes"])
    assert [h.id for h in hits][:2] == [ids[0], ids[1]]
    assert hits[1].score == pytest.approx(hits[0].score * 0.25 / 0.75, rel=0.01)

    settings.MEMORY = {**settings.MEMORY, "RECALL_BARE_QUESTION_WEIGHT": 1.0}  # asking counts in full
    hits = service.recall("lighthouse museum", agent_id="bot", types=["episodes"])
    assert ids[1] not in [h.id for h in hits]  # nothing lifts the answer now


def test_an_episode_counts_by_a_quarter_power_of_its_length_and_a_fact_keeps_its_score(service, keyword_only, settings):
    """A turn that says more is likelier to hold what is asked for: an episode's relevance is scaled
    by (its length / the median episode length) ** RECALL_LENGTH_EXPONENT; facts are not scaled."""
    settings.MEMORY = {**settings.MEMORY, "RECALL_CONTEXT_WEIGHTS": (0, 0, 0, 0), "RECALL_SESSION_WEIGHT": 0}
    texts = [
        "the lighthouse museum",
        "we spent the afternoon at the lighthouse museum, where the keeper showed us the lamp room",
        "the lighthouse museum was shut on Monday, so we walked along the harbour wall instead and "
        "ate chips by the boats until the rain came in from the sea",
    ]
    ids = [
        service.record_episode(
            agent_id="bot", started_at=timezone.now(), conversation=[{"role": "user", "content": t}], success=True
        ).pk
        for t in texts
    ]
    fact = service.set_fact("museum", "the lighthouse museum opens at nine", scope="agent", agent_id="bot").fact
    length = {d.item_id: len(d.text) for d in RecallDocument.objects.filter(kind="episode", item_id__in=ids)}

    def scores(exponent):
        settings.MEMORY = {**settings.MEMORY, "RECALL_LENGTH_EXPONENT": exponent}
        return {(h.kind, h.id): h.score for h in service.recall("lighthouse museum", agent_id="bot")}

    flat, scaled = scores(0), scores(0.25)
    median = sorted(length.values())[1]
    for episode_id in ids:
        factor = (length[episode_id] / median) ** 0.25
        assert scaled[("episode", episode_id)] == pytest.approx(flat[("episode", episode_id)] * factor)
    assert scaled[("fact", fact.pk)] == pytest.approx(flat[("fact", fact.pk)])


def test_the_vector_leg_is_standardized_over_every_document_ranked():
    """The vector leg's z uses the cosines of all the documents being ranked, not of its own list
    only: a cosine counts by how far it stands above what the question's other candidates get."""
    import math

    from memory.recall.ranking import TIE_BREAK, _fuse

    cosines = {1: 0.9, 2: 0.5, 3: 0.1, 4: 0.1}
    rows = dict.fromkeys(cosines)
    fused = _fuse("standardized", "vector", rows, {}, 1.0, cosines)
    mean = sum(cosines.values()) / 4
    std = math.sqrt(sum((c - mean) ** 2 for c in cosines.values()) / 4)
    assert fused[1] == pytest.approx((0.9 - mean) / std + TIE_BREAK * 0.9)
    assert fused[2] == pytest.approx((0.5 - mean) / std + TIE_BREAK * 0.5)
    assert fused[3] == pytest.approx(TIE_BREAK * 0.1)  # below the mean: nothing from the leg


def test_a_question_naming_a_month_finds_the_episode_of_that_month(service, keyword_only):
    """An episode's recall text begins with its date in words (migration 0019): the words that answer
    seldom say when, the episode's time does."""
    for day, text in [
        (datetime(2023, 5, 8, 13, 56, tzinfo=UTC), "I started an internship at an engineering firm"),
        (datetime(2023, 6, 27, 10, 37, tzinfo=UTC), "I started volunteering at an animal shelter"),
    ]:
        service.record_episode(
            started_at=day, agent_id="bot", conversation=[{"role": "Jolene", "content": text}], success=True
        )
    assert "shelter" in service.recall("what did Jolene start in June 2023?", agent_id="bot")[0].text
    may = service.recall("what did Jolene start in May 2023?", agent_id="bot")[0]
    assert "internship" in may.text
    assert RecallDocument.objects.get(kind="episode", item_id=may.id).text == (
        "8 May 2023\nJolene: I started an internship at an engineering firm"
    )


def test_vector_blob_round_trip():
    import numpy as np

    from memory.embedding.embedder import from_blobs

    v = np.arange(4, dtype=np.float32) / 3
    assert np.array_equal(from_blobs([to_blob(v), to_blob(v * 2)], 4), np.stack([v, v * 2]))


# ------------------------------------------------------- fusion of the two legs

HABITS = ["run", "yoga", "swim", "meeting", "emails", "report", "news", "book", "paper"]


@pytest.fixture
def concept_embedder(settings):
    """Hybrid recall with a model that knows "beverage" and "tea" are both about drinks."""
    settings.MEMORY = {
        **getattr(settings, "MEMORY", {}),
        "EMBEDDINGS": "indexer_embedders.ConceptEmbedding",
        "EMBEDDINGS_MODEL_ID": "concepts-6",
    }
    reset_vector_index()
    yield
    reset_vector_index()


def _habits_and_a_drink(service):
    for i, habit in enumerate(HABITS):
        service.set_fact(f"habit_{i}", f"{habit} every morning", scope="agent", agent_id="bot")
    service.set_fact("favourite", "green tea", scope="agent", agent_id="bot")
    assert service.wait_for_vectors(timeout=30)


def test_hybrid_follows_the_leg_whose_candidate_stands_out(service, concept_embedder, settings):
    """Every habit matches "morning" equally, so the keyword leg cannot tell them apart; the vector
    leg clearly prefers the drink. The answer comes first in hybrid recall, although it shares no
    word with the question, where a fixed keyword weight (the "weighted" fusion) buries it."""
    _habits_and_a_drink(service)
    question = "which beverage do I like in the morning"
    assert service.recall(question, agent_id="bot", mode="hybrid")[0].item.key == "favourite"
    assert "favourite" not in [h.item.key for h in service.recall(question, agent_id="bot", mode="keyword")]

    settings.MEMORY = {**settings.MEMORY, "RECALL_FUSION": "weighted"}
    assert service.recall(question, agent_id="bot", mode="hybrid")[0].item.key != "favourite"


def test_a_clear_keyword_match_still_comes_first(service, concept_embedder):
    """The vectors cannot tell the habits apart (each is "morning" plus one concept); the one habit
    named in the question is the keyword leg's clear winner and comes first."""
    _habits_and_a_drink(service)
    hits = service.recall("when do I swim", agent_id="bot", mode="hybrid")
    assert hits[0].item.value == "swim every morning"


def test_an_unknown_fusion_is_refused_by_name(service, concept_embedder, settings):
    from django.core.exceptions import ImproperlyConfigured

    settings.MEMORY = {**settings.MEMORY, "RECALL_FUSION": "average"}
    with pytest.raises(ImproperlyConfigured, match="RECALL_FUSION"):
        service.recall("tea", agent_id="bot", mode="hybrid")


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's planner without statistics")
def test_recall_reads_its_candidates_by_primary_key_on_an_unanalyzed_sqlite_database(service, keyword_only):
    """Without ANALYZE, SQLite took the owner or kind index for the candidate check and the session
    neighbours, and so read every document of the owner (or every episode) on every recall: 10 ms of a
    15 ms recall at 100,000 documents (bench/README.md). Each must look its candidates up by id."""
    for i in range(30):
        service.set_fact(f"tea_{i}", f"green tea number {i}", scope="agent", agent_id="helper")
        service.record_episode(
            started_at=timezone.now(),
            agent_id="helper",
            session_id="s1",
            conversation=[{"role": "user", "content": f"I drink green tea {i}"}],
            success=True,
        )
    captured = []

    def capture(execute, sql, params, many, context):
        captured.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        hits = service.recall("green tea", agent_id="helper", limit=5)
    assert len(hits) == 5
    # The candidate check and the session neighbours.
    checked = [(sql, params) for sql, params in captured if "viewer_owners(k, r)" in sql or "e.session_id, (" in sql]
    assert len(checked) == 2, [sql[:60] for sql, _ in captured]
    # (With statistics SQLite may rightly scan a table this small; bench.recall_latency, which
    # analyzes 100,000 documents, covers that case.)
    with connection.cursor() as cursor:
        for sql, params in checked:
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
            plan = [row[-1] for row in cursor.fetchall()]
            reads = [step for step in plan if step.startswith(("SCAN d", "SEARCH d", "BLOOM FILTER ON d"))]
            assert reads == ["SEARCH d USING INTEGER PRIMARY KEY (rowid=?)"], plan
