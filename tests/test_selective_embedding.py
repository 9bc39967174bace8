"""MEMORY["EMBED_EPISODE_KINDS"]: only the episode kinds it lists get a vector; the others stay in keyword
recall and are never pending (the seeds' selective indexing)."""

import pytest
from django.utils import timezone
from indexer_embedders import MODEL_ID

from memory.embedding.embedder import reset_embedder
from memory.models import RecallDocument
from memory.recall.indexer import indexer
from memory.recall.vectors import reset_vector_index

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def hybrid(settings):
    settings.MEMORY = {
        **settings.MEMORY,
        "EMBEDDINGS": "indexer_embedders.TransactionCheckingEmbedding",
        "EMBEDDINGS_MODEL_ID": MODEL_ID,
        "EMBED_ON_WRITE": "background",
        "EMBED_EPISODE_KINDS": ["decision", "error"],
    }
    reset_embedder()
    reset_vector_index()
    yield settings
    assert indexer.wait(30)
    reset_embedder()
    reset_vector_index()


def episode(service, kind, text):
    return service.record_episode(
        started_at=timezone.now(), agent_id="bot", trigger_type=kind, summary=text, success=True
    )


def vector_of(item):
    return RecallDocument.objects.get(kind="episode", item_id=item.pk).embedding


def test_only_the_listed_kinds_are_embedded_and_the_rest_are_not_pending(hybrid, service):
    decided = episode(service, "decision", "we chose PostgreSQL for the JSON support")
    chatter = episode(service, "chat", "user asked what time it is")
    fact = service.set_fact("db", "PostgreSQL", scope="agent", agent_id="bot").fact
    assert service.wait_for_vectors(30)
    assert vector_of(decided) is not None and vector_of(chatter) is None
    assert RecallDocument.objects.get(kind="fact", item_id=fact.pk).embedding is not None  # facts: always
    assert service.pending_vectors() == 0  # the chatter is not waiting for anything
    # Keyword recall still finds what has no vector.
    hits = service.recall("what time is it", agent_id="bot", mode="keyword", types=("episodes",))
    assert [h.id for h in hits] == [chatter.pk]
    vector_hits = service.recall("what time is it", agent_id="bot", mode="vector", types=("episodes",))
    assert chatter.pk not in [h.id for h in vector_hits]


def test_a_full_reindex_drops_vectors_of_kinds_no_longer_listed(hybrid, service):
    hybrid.MEMORY = {**hybrid.MEMORY, "EMBED_EPISODE_KINDS": None}
    chatter = episode(service, "chat", "user asked what time it is")
    assert service.wait_for_vectors(30) and vector_of(chatter) is not None
    hybrid.MEMORY = {**hybrid.MEMORY, "EMBED_EPISODE_KINDS": ["decision"]}
    decided = episode(service, "decision", "we chose PostgreSQL")
    assert service.wait_for_vectors(30)
    service.reindex_recall()
    assert vector_of(chatter) is None and vector_of(decided) is not None
    assert service.pending_vectors() == 0
