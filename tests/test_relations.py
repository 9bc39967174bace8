"""The memory graph (memory/recall/relations.py): similar and supports edges, the walk, reachability, cascades."""

import hashlib

import numpy as np
import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone
from langchain_core.embeddings import Embeddings

from memory.learning.consolidation import BaseExtractor, ExtractedFact
from memory.models import Fact, MemoryRelation, RecallDocument
from memory.recall.relations import contradictions, link_contradictions
from memory.recall.upkeep import flush_buffers
from memory.recall.vectors import reset_vector_index

SIZE = 256


class WordEmbeddings(Embeddings):
    """Bag of words: texts that share most of their words are close (a real `Embeddings`, no model)."""

    def __init__(self, **kwargs):
        pass

    def _one(self, text):
        vector = np.zeros(SIZE)
        for word in text.lower().replace(":", " ").split():
            vector[int(hashlib.md5(word.encode()).hexdigest(), 16) % SIZE] += 1.0
        norm = np.linalg.norm(vector)
        return (vector / norm if norm else vector).tolist()

    def embed_documents(self, texts):
        return [self._one(t) for t in texts]

    def embed_query(self, text):
        return self._one(text)


@pytest.fixture
def words(settings):
    settings.MEMORY = {**settings.MEMORY, "EMBEDDINGS": f"{__name__}.WordEmbeddings", "EMBEDDINGS_MODEL_ID": "words"}
    reset_vector_index()
    yield
    reset_vector_index()


def doc(kind, item_id):
    return RecallDocument.objects.get(kind=kind, item_id=item_id)


def edges():
    return {
        (e.source.kind, e.source.item_id, e.relation, e.target.kind, e.target.item_id)
        for e in MemoryRelation.objects.select_related("source", "target")
    }


def test_a_new_memory_is_linked_to_its_closest_memories_of_the_same_owner(service, user_factory, words):
    ann, bob = user_factory("ann"), user_factory("bob")
    tea = service.set_fact("drink", "green tea every morning with honey", scope="user", user_id=ann.pk).fact
    service.set_fact("city", "lives in porto near the river", scope="user", user_id=ann.pk)
    bobs = service.set_fact("drink", "green tea every morning with honey", scope="user", user_id=bob.pk).fact
    same = service.set_fact("morning_drink", "green tea every morning with honey", scope="user", user_id=ann.pk).fact
    assert edges() == {("fact", same.pk, "similar", "fact", tea.pk)}  # not to bob's twin, not to the city
    edge = MemoryRelation.objects.get()
    assert 0.8 <= edge.weight <= 1.0
    assert bobs.pk not in {e[4] for e in edges()} | {e[1] for e in edges()}


def test_at_most_three_similar_edges_and_none_below_the_threshold(service, words, settings):
    for i in range(5):
        service.set_fact(f"note_{i}", "the quarterly report is due on friday", scope="agent", agent_id="bot")
    last = Fact.objects.get(key="note_4")
    assert MemoryRelation.objects.filter(source=doc("fact", last.pk)).count() == 3
    settings.MEMORY = {**settings.MEMORY, "RELATIONS": {"SIMILAR_MIN_COSINE": 0.99}}
    service.set_fact("note_5", "the quarterly report is due on monday", scope="agent", agent_id="bot")
    assert not MemoryRelation.objects.filter(source=doc("fact", Fact.objects.get(key="note_5").pk)).exists()


def test_similar_edges_are_written_after_the_write_commits_not_inside_it(
    service, words, settings, capture_data_queries
):
    settings.MEMORY = {**settings.MEMORY, "EMBED_ON_WRITE": "background"}
    service.set_fact("a", "green tea every morning", scope="global")
    with capture_data_queries() as q:
        service.set_fact("b", "green tea every morning", scope="global")
    assert not any("memory_relation" in sql or "memory_recall_scope" in sql for sql in q.data)


class TeaExtractor(BaseExtractor):
    def extract(self, episode):
        return [ExtractedFact(key="drink", value="green tea", fact_type="user_preference")]


def test_consolidation_links_each_fact_to_its_evidence(service, user_factory, keyword_only):
    ann = user_factory("ann")
    episode = service.record_episode(
        started_at=timezone.now(), success=True, user_id=ann.pk, summary="ann said she drinks green tea"
    )
    report = service.consolidate(extractor=TeaExtractor())
    assert report.ok and report.processed == [episode.pk]
    fact = Fact.objects.get(key="drink")
    assert edges() == {("fact", fact.pk, "supports", "episode", episode.pk)}
    assert service.memory_relations("episode", episode.pk) == [("from", "supports", 1.0, "fact", fact.pk)]
    assert service.memory_health().metrics["reachability"] == 100.0


def test_deleting_a_memory_deletes_its_edges_whoever_deletes_it(service, user_factory, keyword_only):
    ann = user_factory("ann")
    episode = service.record_episode(started_at=timezone.now(), success=True, user_id=ann.pk, summary="tea talk")
    service.consolidate(extractor=TeaExtractor())
    assert MemoryRelation.objects.count() == 1
    service.delete_episodes([episode.pk])
    assert not MemoryRelation.objects.exists()
    # Forgetting the person: the fact's document and any edge go with the person.
    episode = service.record_episode(started_at=timezone.now(), success=True, user_id=ann.pk, summary="more tea")
    service.consolidate(extractor=TeaExtractor())
    assert MemoryRelation.objects.count() == 1
    service.delete_users([ann.pk], cascade=True)
    assert not MemoryRelation.objects.exists() and not RecallDocument.objects.exists()


def test_recall_walks_one_hop_only_when_asked_and_only_to_what_the_viewer_sees(
    service, user_factory, keyword_only, settings
):
    ann, bob = user_factory("ann"), user_factory("bob")
    episode = service.record_episode(
        started_at=timezone.now(), success=True, user_id=ann.pk, summary="we talked about her allotment"
    )
    service.consolidate(extractor=TeaExtractor())  # drink = green tea, supported by the episode
    fact = Fact.objects.get(key="drink")
    bobs = service.set_fact("plan", "visit the allotment", scope="user", user_id=bob.pk).fact
    MemoryRelation.objects.create(source=doc("episode", episode.pk), target=doc("fact", bobs.pk), relation="similar")

    hits = service.recall("allotment", user_id=ann.pk)
    assert [(h.kind, h.id) for h in hits] == [("episode", episode.pk)]  # no walk by default
    settings.MEMORY = {**settings.MEMORY, "RECALL_WALK_DEPTH": 1}
    hits = service.recall("allotment", user_id=ann.pk)
    assert [(h.kind, h.id) for h in hits] == [("episode", episode.pk), ("fact", fact.pk)]  # never bob's
    assert hits[0].via is None
    assert hits[1].via == {"relation": "supports", "from": {"kind": "episode", "id": episode.pk}}
    assert hits[1].score == pytest.approx(hits[0].score * 0.5)
    assert hits[1].as_dict()["via"]["relation"] == "supports"


def test_the_admin_shows_a_memorys_relations(staff_client, service, user_factory, keyword_only):
    ann = user_factory("ann")
    episode = service.record_episode(started_at=timezone.now(), success=True, user_id=ann.pk, summary="tea")
    service.consolidate(extractor=TeaExtractor())
    fact = Fact.objects.get(key="drink")
    page = staff_client.get(f"/memories/memory/fact/{fact.pk}/change/").content.decode()
    assert f'supports → <a href="/memories/memory/episode/{episode.pk}/change/">episode {episode.pk}</a>' in page
    page = staff_client.get(f"/memories/memory/episode/{episode.pk}/change/").content.decode()
    assert f'supports ← <a href="/memories/memory/fact/{fact.pk}/change/">fact {fact.pk}</a>' in page


def test_an_edge_from_a_memory_to_itself_is_refused_by_the_database(service, keyword_only):
    fact = service.set_fact("a", "b", scope="global").fact
    with pytest.raises(IntegrityError), transaction.atomic():
        MemoryRelation.objects.create(source=doc("fact", fact.pk), target=doc("fact", fact.pk), relation="similar")


def test_reindex_rebuilds_the_similar_edges(service, words):
    first = service.set_fact("a", "green tea every morning with honey", scope="global").fact
    second = service.set_fact("b", "green tea every morning with honey", scope="global").fact
    assert edges() == {("fact", second.pk, "similar", "fact", first.pk)}
    MemoryRelation.objects.all().delete()
    assert service.reindex_recall() == 2
    assert edges() == {
        ("fact", first.pk, "similar", "fact", second.pk),
        ("fact", second.pk, "similar", "fact", first.pk),
    }


def test_a_write_that_replaces_a_value_contradicts_the_version_it_replaced_after_it_commits(
    service, user_factory, keyword_only, django_capture_on_commit_callbacks, capture_data_queries, staff_client
):
    ann = user_factory("ann")
    fact = service.set_fact("city", "Porto", scope="user", user_id=ann.pk).fact
    with django_capture_on_commit_callbacks(execute=False) as callbacks, capture_data_queries() as q:
        assert service.set_fact("city", "Lisbon", scope="user", user_id=ann.pk).action == "updated"
    assert not any("memory_relation" in sql for sql in q.data) and not MemoryRelation.objects.exists()
    for callback in callbacks:  # what runs once the write has committed: the edge waits for a batch
        callback()
    assert contradictions.pending == 1 and not MemoryRelation.objects.exists()
    flush_buffers()  # the end of a request writes it (as reading it, or the process's exit, would)
    assert contradictions.pending == 0
    edge = MemoryRelation.objects.get()
    assert (edge.relation, edge.source.item_id, edge.target_id) == ("contradicts", fact.pk, None)
    assert (edge.target_version.value, edge.target_version.fact_id) == ("Porto", fact.pk)
    assert service.memory_relations("fact", fact.pk) == [
        ("to", "contradicts", 1.0, "fact_version", edge.target_version_id)
    ]
    page = staff_client.get(f"/memories/memory/fact/{fact.pk}/change/").content.decode()
    assert f"contradicts → version {edge.target_version_id} of the history" in page
    # Confirming or refusing (overwrite=False) replaces nothing; forgetting the person takes the edge.
    with django_capture_on_commit_callbacks(execute=True):
        service.set_fact("city", "Lisbon", scope="user", user_id=ann.pk)
        service.set_fact("city", "Faro", scope="user", user_id=ann.pk, overwrite=False)
    assert MemoryRelation.objects.count() == 1
    service.delete_users([ann.pk], cascade=True)
    assert not MemoryRelation.objects.exists()


def test_contradicts_edges_a_killed_process_had_not_written_come_back(
    service, user_factory, keyword_only, django_capture_on_commit_callbacks
):
    """The edges are derived from fact history: a batch lost with its process is written with the
    fact's next replaced value, or by `memory reindex` (link_contradictions over every fact)."""
    ann = user_factory("ann")
    fact = service.set_fact("city", "Porto", scope="user", user_id=ann.pk).fact
    with django_capture_on_commit_callbacks(execute=True):
        service.set_fact("city", "Lisbon", scope="user", user_id=ann.pk)
    contradictions._pending.clear()  # the process died before its batch was written
    with django_capture_on_commit_callbacks(execute=True):
        service.set_fact("city", "Faro", scope="user", user_id=ann.pk)
    assert contradictions.flush() == 2
    replaced = [e.target_version.value for e in MemoryRelation.objects.order_by("target_version__valid_from")]
    assert replaced == ["Porto", "Lisbon"]
    MemoryRelation.objects.all().delete()
    assert link_contradictions() == 2 and link_contradictions() == 0  # every fact's, once
    assert service.memory_relations("fact", fact.pk)[0][:2] == ("to", "contradicts")
