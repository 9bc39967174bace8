"""Vectors off the write path (memory/recall/indexer.py): no model call inside a transaction, nothing lost.

Transactional tests: the worker embeds only what has committed, on its own connection.
"""

import datetime
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import indexer_embedders as emb
import pytest
from conftest import database_url
from django.utils import timezone

from memory.embedding.embedder import split_pieces, without_date_line
from memory.models import RecallDocument, StoreItem
from memory.recall.indexer import Indexer, indexer
from memory.recall.vectors import reset_vector_index
from workflows.store import EngramStore

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.django_db(transaction=True)


def configure(settings, embedder):
    settings.MEMORY = {
        **settings.MEMORY,
        "EMBEDDINGS": f"indexer_embedders.{embedder}",
        "EMBEDDINGS_MODEL_ID": emb.MODEL_ID,  # one model whichever wrapper: their vectors are the same
        "EMBED_ON_WRITE": "background",
    }
    reset_vector_index()


@pytest.fixture(autouse=True)
def _clean_switches():
    emb.calls_in_transaction.clear()
    emb.failing.clear()
    emb.released.set()
    yield
    emb.failing.clear()
    emb.released.set()
    assert indexer.wait(30)


def pending():
    return RecallDocument.objects.filter(embedding__isnull=True).exclude(text="").count()


def test_no_write_path_calls_the_model_inside_a_transaction(settings, service, user_factory):
    configure(settings, "TransactionCheckingEmbedding")
    user = user_factory()
    service.set_fact("drink", "green tea", scope="user", user_id=user.pk)
    service.set_fact("drink", "black coffee", scope="user", user_id=user.pk)  # an update re-embeds
    episode = service.start_episode(agent_id="bot", user_id=user.pk)
    service.add_message(episode.pk, "user", "I booked a table for two")
    service.complete_episode(episode.pk, success=True, summary="booked a table")
    service.record_episode(
        started_at=timezone.now(),
        agent_id="bot",
        user_id=user.pk,
        success=True,
        conversation=[{"role": "user", "content": "the dentist is on friday"}],
    )
    service.save_procedure("weather", description="ask for the city first")
    store = EngramStore()  # LangGraph's store on Engram's embedder: its items too
    store.put(("engram", "users", str(user.pk), "notes"), "n1", {"text": "allergic to peanuts"})
    store.put(
        ("engram", "users", str(user.pk), "notes"), "n1", {"text": "allergic to shellfish"}
    )  # an update re-embeds
    assert service.wait_for_vectors(timeout=30)
    assert emb.calls_in_transaction == []
    assert pending() == 0 and service.pending_vectors() == 0
    hits = service.recall("black coffee", user_id=user.pk, types=("facts",), mode="vector", limit=1)
    assert [h.item.value for h in hits] == ["black coffee"]
    assert StoreItem.objects.get(key="n1").embedding is not None
    [found] = store.search(("engram", "users", str(user.pk)), query="allergic to shellfish", limit=1)
    assert found.value == {"text": "allergic to shellfish"} and found.score is not None


def test_inline_mode_does_call_the_model_inside_the_write(settings, service):
    """The check above can fail: the old, inline path embeds inside the write's transaction."""
    configure(settings, "TransactionCheckingEmbedding")
    settings.MEMORY = {**settings.MEMORY, "EMBED_ON_WRITE": "inline"}
    service.set_fact("city", "Porto", scope="global")
    assert len(emb.calls_in_transaction) == 1 and "porto" in emb.calls_in_transaction[0][0]


def test_an_embedder_that_raises_leaves_every_write_committed_and_is_retried(settings, service, client):
    configure(settings, "FailingEmbedding")
    emb.failing.set()
    failures = indexer.failures
    write = service.set_fact("door", "blue", scope="global")
    episode = service.record_episode(started_at=timezone.now(), success=True, summary="painted the door")
    assert service.get_fact("door").value == "blue" and service.get_episode(episode.pk).summary
    deadline = time.monotonic() + 10
    while indexer.failures == failures and time.monotonic() < deadline:
        time.sleep(0.05)
    assert indexer.failures > failures  # counted, logged
    assert service.pending_vectors() == 2
    body = client.get("/healthz").json()
    assert body["vectors"]["pending"] == 2 and body["vectors"]["failures"] >= 1
    assert [h.item.pk for h in service.recall("door blue", types=("facts",), mode="keyword")] == [write.fact.pk]
    emb.failing.clear()  # the service is back: the worker retries after its pause
    assert service.wait_for_vectors(timeout=30)
    assert service.pending_vectors() == 0


def test_an_embedder_that_hangs_does_not_block_writes(settings, service):
    configure(settings, "BlockingEmbedding")
    emb.released.clear()
    started = time.monotonic()
    for i in range(5):
        service.set_fact(f"note_{i}", f"text {i}", scope="global")
    assert time.monotonic() - started < 5
    assert not service.wait_for_vectors(timeout=0.2)  # the worker is stuck in the model...
    assert service.pending_vectors() >= 4  # ...and said so
    emb.released.set()
    assert service.wait_for_vectors(timeout=30)
    assert service.pending_vectors() == 0


KILLED_WRITER = """
import sys, django
django.setup()
from django.test import override_settings
with override_settings(MEMORY={"EMBEDDINGS": "indexer_embedders.BlockingEmbedding", "EMBEDDINGS_MODEL_ID": "fake-32", "EMBED_ON_WRITE": "background", "EMBED_CLAIM_SECONDS": 1}):
    import indexer_embedders
    indexer_embedders.released.clear()  # the model hangs: the process dies before any vector is stored
    from memory.service import MemoryService
    MemoryService().set_fact("locker", "number 4711", scope="global")
    print("committed", flush=True)
    sys.stdin.readline()
"""


def test_documents_of_a_process_killed_before_embedding_are_embedded_after_restart(settings, service, tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO), str(REPO / "tests")]),
        "DATABASE_URL": database_url(),
        "ENGRAM_DATA_DIR": str(tmp_path),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER],
        env=env,
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "committed", proc.stderr.read()
        time.sleep(0.3)  # the worker is inside the model call
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    configure(settings, "TransactionCheckingEmbedding")
    assert service.pending_vectors() == 1  # committed, never embedded
    time.sleep(1.1)  # the dead worker's claim on it lapses (its EMBED_CLAIM_SECONDS); then anyone takes it over
    restarted = Indexer()  # a new process's worker: its first act is to sweep what is pending
    restarted.start()
    assert restarted.wait(timeout=30)
    assert service.pending_vectors() == 0
    assert [h.item.key for h in service.recall("locker number", types=("facts",), mode="vector", limit=1)] == ["locker"]


@pytest.mark.django_db
def test_a_repeated_query_is_embedded_once(settings, service):
    """Query vectors are cached per text: a question asked again skips the model (bounded cache)."""
    from memory.embedding.embedder import reset_embedder

    configure(settings, "QueryCountingEmbedding")
    settings.MEMORY = {**settings.MEMORY, "EMBED_ON_WRITE": "inline", "QUERY_EMBEDDING_CACHE": 2}
    reset_embedder()
    service.set_fact("drink", "green tea", scope="global")
    emb.query_calls.clear()
    for _ in range(3):
        assert service.recall("what do I drink", mode="vector").hits
    assert emb.query_calls == ["what do I drink"]
    for question in ("tea?", "coffee?", "what do I drink"):  # two newer questions push it out
        service.recall(question, mode="vector")
    assert emb.query_calls == ["what do I drink", "tea?", "coffee?", "what do I drink"]


def test_pieces_cover_the_whole_text_and_appending_changes_only_the_last():
    assert split_pieces("user: I like green tea", 8) == ["user: I like green tea"]  # short: as it is
    lines = [f"user: message {i} says word{i} and more" for i in range(40)]
    text = "\n".join(lines)
    pieces = split_pieces(text, 20)
    assert all(len(piece.split()) <= 20 for piece in pieces)
    assert " ".join(pieces).split() == text.split()  # every word reaches the model, in order
    longer = split_pieces(text + "\nassistant: noted", 20)
    assert longer[: len(pieces) - 1] == pieces[:-1]
    assert split_pieces("one " * 50, 20) == ["one " * 19 + "one"] * 2 + ["one " * 9 + "one"]  # a long line is cut


@pytest.mark.django_db
def test_appending_a_message_embeds_only_the_piece_it_changes(settings, service):
    from memory.embedding.embedder import reset_embedder

    configure(settings, "DocumentCountingEmbedding")
    settings.MEMORY = {**settings.MEMORY, "EMBED_ON_WRITE": "inline", "EMBED_PIECE_WORDS": 20}
    reset_embedder()
    episode = service.start_episode(agent_id="bot")
    for i in range(30):
        service.add_message(episode.pk, "user", f"message {i} mentions item{i} today")
    document = RecallDocument.objects.get(kind="episode", item_id=episode.pk)
    assert (
        len(bytes(document.embedding))
        == 4 * emb.SIZE * len(split_pieces(without_date_line(document.text), 20))
        > 4 * emb.SIZE
    )
    emb.document_texts.clear()
    service.add_message(episode.pk, "user", "message 30 mentions item30 today")
    longer = without_date_line(document.text) + "\nuser: message 30 mentions item30 today"
    assert emb.document_texts == [split_pieces(longer, 20)[-1]]


@pytest.mark.django_db
def test_the_model_reads_an_episode_without_its_date_line(settings, service):
    """The date is for the keyword leg; every episode of a day would share it in its vector."""
    from memory.embedding.embedder import reset_embedder

    configure(settings, "DocumentCountingEmbedding")
    settings.MEMORY = {**settings.MEMORY, "EMBED_ON_WRITE": "inline"}
    reset_embedder()
    emb.document_texts.clear()
    when = datetime.datetime(2023, 5, 8, 12, tzinfo=datetime.UTC)
    episode = service.record_episode(
        agent_id="bot", started_at=when, conversation=[{"role": "user", "content": "8 May 2023 was fun"}], success=True
    )
    document = RecallDocument.objects.get(kind="episode", item_id=episode.pk)
    assert document.text == "8 May 2023\nuser: 8 May 2023 was fun" and document.embedding is not None
    assert emb.document_texts == ["user: 8 May 2023 was fun"]  # a date the text itself says stays
    assert service.recall("May 2023", agent_id="bot", mode="keyword").hits[0].id == episode.pk


@pytest.mark.postgres
def test_the_worker_skips_a_row_another_transaction_holds_instead_of_waiting(settings, service):
    """PostgreSQL: forgetting a person deletes their documents (with their facts) while the worker may
    be storing vectors; if the worker waited for a row the delete held while the delete waited for
    one the worker had written, that was a deadlock (bench.merges, hybrid). The worker takes the
    rows it can at once and leaves the others pending for a later pass."""
    from django.db import connections, transaction

    from memory.recall.indexer import embed_documents

    configure(settings, "TransactionCheckingEmbedding")
    service.set_fact("drink", "green tea")
    service.set_fact("food", "figs")
    assert indexer.wait(30)
    held, other = RecallDocument.objects.filter(kind="fact").order_by("id")
    RecallDocument.objects.filter(pk__in=[held.pk, other.pk]).update(embedding=None)
    locked, release = threading.Event(), threading.Event()

    def hold_the_row():
        try:
            with transaction.atomic():
                list(RecallDocument.objects.select_for_update().filter(pk=held.pk))
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    try:
        assert locked.wait(10)
        result = []
        writer = threading.Thread(
            target=lambda: (result.append(embed_documents([(held.pk, held.text), (other.pk, other.text)])),
                            connections.close_all())
        )  # fmt: skip
        writer.start()
        writer.join(10)
        assert not writer.is_alive(), "the worker waited for the held row"
    finally:
        release.set()
        holder.join(10)
    assert result == [1]
    assert RecallDocument.objects.get(pk=other.pk).embedding is not None
    assert RecallDocument.objects.get(pk=held.pk).embedding is None  # still pending: a later pass embeds it


def test_the_workers_claim_of_a_write_takes_over_a_lapsed_lease_and_leaves_a_live_one(settings, service):
    """The worker claims its queued writes' documents in one statement: a lease left by a worker that
    died (past its claimed_until) is taken over; one another worker holds now is left to it."""
    from memory.models import EmbeddingClaim

    configure(settings, "TransactionCheckingEmbedding")
    service.set_fact("locker", "number 4711")
    service.set_fact("bike", "a blue bicycle")
    assert indexer.wait(30) and pending() == 0
    locker, bike = (RecallDocument.objects.get(text__contains=word).pk for word in ("locker", "bike"))
    now = timezone.now()
    EmbeddingClaim.objects.create(
        source="recall",
        row_id=locker,
        claimed_by="a worker that died",
        claimed_until=now - datetime.timedelta(seconds=1),
    )
    EmbeddingClaim.objects.create(
        source="recall", row_id=bike, claimed_by="a worker at work", claimed_until=now + datetime.timedelta(seconds=60)
    )
    service.set_fact("locker", "number 1234")  # new texts: pending, queued for this process's worker
    service.set_fact("bike", "a red bicycle")
    assert indexer.wait(30)
    assert RecallDocument.objects.get(pk=locker).embedding is not None
    assert RecallDocument.objects.get(pk=bike).embedding is None  # the other worker's to store
    assert not EmbeddingClaim.objects.filter(row_id=locker).exists()  # taken over, then released with the vector
    assert EmbeddingClaim.objects.get(row_id=bike).claimed_by == "a worker at work"
    EmbeddingClaim.objects.filter(row_id=bike).delete()


@pytest.mark.postgres
def test_the_workers_commits_do_not_wait_for_the_wal_flush_and_the_writers_still_do(settings, service):
    """PostgreSQL: each commit of the embedding worker (its claim, its vectors) waited for a WAL flush,
    in the queue of the writers' own commits; a crash can lose only vectors, which are pending again.
    Its connection commits without the wait; the writers' connections are left as they were."""
    from django.db import connection

    configure(settings, "CommitModeEmbedding")
    emb.commit_modes.clear()
    service.set_fact("drink", "green tea")
    assert indexer.wait(30)
    assert pending() == 0
    assert emb.commit_modes and set(emb.commit_modes) == {"off"}
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"


def test_a_burst_of_writes_is_linked_after_it_each_to_its_closest_of_the_whole_burst(settings, service):
    """The worker links what it embedded once no more writes wait for it: a document embedded while
    the rest of the burst was still queued is linked to the documents written after it too."""
    from memory.models import MemoryRelation, Relation

    configure(settings, "BlockingConceptEmbedding")  # the three texts are alike
    emb.released.clear()
    first = service.set_fact("a", "green tea every morning", scope="global").fact
    time.sleep(0.5)  # the worker has taken the first write alone and hangs in the model
    later = [service.set_fact(key, "green tea every morning", scope="global").fact for key in ("b", "c")]
    emb.released.set()
    assert service.wait_for_vectors(timeout=30)
    docs = dict(RecallDocument.objects.filter(kind="fact").values_list("item_id", "id"))
    similar = set(MemoryRelation.objects.filter(relation=Relation.SIMILAR).values_list("source_id", "target_id"))
    assert {(docs[first.pk], docs[fact.pk]) for fact in later} <= similar
    assert {(docs[fact.pk], docs[first.pk]) for fact in later} <= similar


def test_a_request_never_embeds_documents_on_its_own_thread(settings, service, api, user_factory):
    """Writes over HTTP and through the service hand their documents to the embedding worker: the
    model runs for them on its thread, never on the request's, and vector recall finds them."""
    configure(settings, "ThreadNotingEmbedding")
    emb.embedding_threads.clear()
    user = user_factory()
    for key, value in (("drink", "green tea"), ("sport", "yoga"), ("paper", "the morning news")):
        response = api.post(
            "/api/v1/facts/", {"key": key, "value": value, "scope": "user", "user": user.pk}, format="json"
        )
        assert response.status_code in (200, 201), response.content
    service.record_episode(
        started_at=timezone.now(),
        agent_id="bot",
        user_id=user.pk,
        success=True,
        conversation=[{"role": "user", "content": "I drink coffee in the meeting"}],
    )
    assert service.wait_for_vectors(timeout=30)
    assert emb.embedding_threads and set(emb.embedding_threads) == {"engram-indexer"}
    hits = service.recall("beverage", user_id=user.pk, types=("facts",), mode="vector", limit=1)
    assert [h.item.value for h in hits] == ["green tea"]


def test_a_stream_of_writes_is_linked_once_it_stops(settings, service):
    """Between the batches of a stream of writes the worker links nothing; once the writes stop it
    links all of them to their closest, without anyone waiting for the vectors."""
    from memory.models import MemoryRelation, Relation
    from memory.recall.indexer import LINK_AFTER_SECONDS, QUIET_SECONDS

    configure(settings, "ConceptEmbedding")  # "green tea ..." texts are alike: similar edges
    started, gaps, last = time.monotonic(), [], None
    for i in range(12):
        now = time.monotonic()
        gaps.append(0.0 if last is None else now - last)
        last = now
        service.set_fact(f"drink{i}", f"green tea number {i}", scope="global")
        time.sleep(0.05)
    edges = MemoryRelation.objects.filter(relation=Relation.SIMILAR)
    if max(gaps) < QUIET_SECONDS / 2 and time.monotonic() - started < LINK_AFTER_SECONDS:
        assert not edges.exists()  # the stream went on: nothing linked yet
    deadline = time.monotonic() + QUIET_SECONDS + 20
    while time.monotonic() < deadline and edges.count() < 12:
        time.sleep(0.1)
    linked = set(edges.values_list("source_id", flat=True))
    assert len(linked) == 12  # every fact of the stream, each to its closest ones


def test_a_fact_set_is_found_by_vector_recall_within_a_second(settings, service):
    """The worker gathers writes into batches (EMBED_WAIT_MS) but a write's vector still comes within
    about a second, as the recall guide promises, with nobody waiting for the vectors."""
    configure(settings, "ConceptEmbedding")
    service.set_fact("warmup", "the morning news", scope="global")  # the worker is started and idle
    assert service.wait_for_vectors(timeout=30)
    time.sleep(1.5)
    written = time.monotonic()
    service.set_fact("drink", "green tea", scope="global")
    found = None
    while time.monotonic() - written < 10:
        hits = service.recall("beverage", types=("facts",), mode="vector", limit=1)
        if [h.item.key for h in hits] == ["drink"]:
            found = time.monotonic() - written
            break
        time.sleep(0.02)
    assert found is not None and found < 1.0, found
