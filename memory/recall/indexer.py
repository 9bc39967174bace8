"""Vectors off the write path: one worker per process embeds committed recall documents in batches.

A write commits its row and keyword index (the recall triggers write the item's document without a
vector: *pending*) and, once committed, hands the item to the worker. The worker embeds up to
MEMORY["EMBED_BATCH"] pending texts in one model call, outside any transaction, and stores each
vector in one short transaction, only where the document still has that text and no vector (a newer
write changed it meanwhile: its own turn embeds the new text). Writers never wait for the model, and
concurrent writers share its calls.

The bundled model computes in a child process at the lowest CPU priority (memory/embedding/model_process.py),
which uses the CPU the requests leave; a batch still unanswered when its oldest write is due
(MEMORY["EMBED_DUE_MS"] after that commit) goes to a second child at the requests' priority. The
worker itself runs at the requests' priority: one that ran below them (nice +10, as it once did)
fell behind for good on a busy machine, and vector recall missed writes for minutes.

The `similar` edges of what it embedded (memory/recall/relations.py) wait until no write has come for
QUIET_SECONDS (at most LINK_AFTER_SECONDS, or until someone waits for the vectors): a link loads each
document's owner into this process's vector index and writes the edges in a transaction of its own,
and between the batches of a stream of writes those loads and commits held up the writers of the
process (a queue that is empty for a moment between two batches is not a quiet one). For the same
reason the worker keeps its database connection while writes keep coming, and closes it once they
stop: connecting anew for every batch cost each write a connection's set-up. Edges a killed process
had not written yet are hints lost, not memories: `memory reindex` rebuilds them.

EngramStore's items (memory/domain/store_items.py) go through the same worker under the kind STORE: their
vector lives on the item's own row, and a query search scores an item without one by its words.

"Pending" is a state the database answers (`embedding IS NULL`, text not blank), so nothing is lost
when a process dies between a commit and its embedding: the worker sweeps every pending document
when it starts (with the first request or write of a process), `memory reindex --missing` does the
same by hand, and /healthz reports the backlog. Until then the keyword leg of recall finds them.

An embedder that raises never fails a write: the failure is logged, counted (/healthz), and the
batch retried after a pause that doubles up to a minute. One that hangs holds up only the worker.

MEMORY["EMBED_ON_WRITE"] = "inline" embeds inside the writer's own transaction instead (the behaviour
before this worker existed): for tests and scripts that recall what they wrote before it commits.
"""

import logging
import os
import threading
import time

from django.db import connection, transaction
from django.db.models import Q

from ..backends.rows import held_rows
from ..conf import memory_settings
from ..embedding.embedder import EmbeddingModelChanged, configured_mode, get_embedder, to_blob
from ..embedding.model_process import vectors_due
from ..models import PENDING_VECTOR, Episode, RecallDocument, RecallKind, StoreItem
from ..models.workspaces import current_workspace_id
from .claims import (
    claimed_texts,
    commits_without_flush_wait,
    new_token,
    note_embedding,
    release,
    store_sql,
    take,
    take_items,
    unclaimed_pending_ids,
)
from .relations import link_similar, link_similar_ids

logger = logging.getLogger("engram.memory")

MAX_PAUSE_SECONDS = 60.0
# The `similar` edges of what the worker embedded wait until no write has come for QUIET_SECONDS, at
# most LINK_AFTER_SECONDS and LINK_MAX_WAITING documents (memory/recall/relations.py; Indexer._run).
# QUIET_SECONDS is also how long the worker keeps its database connection after its last batch.
QUIET_SECONDS = 1.0
LINK_AFTER_SECONDS = 5.0
LINK_MAX_WAITING = 4096
STORE = "store"  # the queue's kind of EngramStore items (their own table); other kinds are recall documents
MODELS = (RecallDocument, StoreItem)  # where pending texts wait for a vector


def embed_documents(docs, model=RecallDocument, *, link=True, claimed=None):
    """Embed (row id, text) pairs of `model` and store the vectors of those whose text is unchanged; how many stored.

    Never call inside a transaction: the model call happens here, the writes in one short transaction.
    `link`: also link recall documents to their closest ones now (the worker links later, in bulk).
    `claimed` (default: outside a transaction): take the rows through a claim first (claims.py), so
    that no other process embeds them too; only the rows won are embedded, their texts read anew.
    """
    if claimed is None:
        claimed = not connection.in_atomic_block
    if not docs:
        return 0
    ids = [doc_id for doc_id, _ in docs]
    return _claim_and_embed(lambda token: take(model, ids, token), docs, model, link=link, claimed=claimed)[0]


def embed_items(kind_items, limit):
    """Claim up to `limit` pending recall documents of these {kind: item ids} (the worker's queue) and
    embed them, as embed_documents does without linking: (vectors stored, the (id, text)s embedded).

    The claim finds the documents itself (one statement: claims.take_items), where a read of the
    pending documents and then a claim of their ids were two a batch."""
    return _claim_and_embed(lambda token: take_items(kind_items, token, limit), None, RecallDocument, link=False)


def _claim_and_embed(claim, docs, model, *, link, claimed=True):
    from .ranking import model_guard

    embedder = get_embedder()
    if embedder is None:
        return 0, []
    model_guard.check(embedder)
    token = new_token() if claimed else None
    try:
        if claimed:
            claim(token)
            # Read after the claim committed: a document another worker stored (and released) is not pending.
            docs = claimed_texts(model, token)
            if not docs:
                release(token)
                return 0, []
        stored = _embed_and_store(embedder, docs, model, token)
    except BaseException:
        if claimed:
            release(token)  # the batch failed: another worker may take it now rather than after the lease
        raise
    if link and model is RecallDocument:
        link_similar([(doc_id, vector) for (doc_id, _), vector in stored[1]])
    return stored[0], docs


def _embed_and_store(embedder, docs, model, token):
    texts = [text for _, text in docs]
    note_embedding(model, docs)
    # A recall document stores one vector per piece of its text (long episodes); a store item one.
    vectors = embedder.pieces(texts) if model is RecallDocument else embedder.documents(texts)
    note_model_texts(len(texts))
    # One statement for the batch (executemany): the shorter the worker holds the write lock (and,
    # in this process, the interpreter), the less the writers it shares them with wait.
    table = connection.ops.quote_name(model._meta.db_table)
    rows = [(to_blob(vector), doc_id, text) for (doc_id, text), vector in zip(docs, vectors)]
    with transaction.atomic(), connection.cursor() as cursor:
        # Rows another transaction holds (a person being forgotten) keep no vector now: a later pass
        # embeds them if they are still there. Waiting for them could deadlock (held_rows). SQLite
        # has no row locks (this transaction holds the database): the UPDATE itself skips rows gone.
        ids = [doc_id for _, doc_id, _ in rows]
        held = held_rows(model, ids) if connection.features.has_select_for_update_skip_locked else set(ids)
        if token is None:
            cursor.executemany(
                f"UPDATE {table} SET embedding = %s WHERE id = %s AND embedding IS NULL AND text = %s",
                [row for row in rows if row[1] in held],
            )
        else:
            cursor.executemany(store_sql(model), [(*row, token) for row in rows if row[1] in held])
        stored = max(cursor.rowcount, 0)
        if token is not None:
            release(token)  # with the vectors: a later claimer reads them stored
    return stored, [(doc, vector) for doc, vector in zip(docs, vectors)]


# Texts this process gave the model as documents (/healthz-style figures for benchmarks and tasks).
model_texts = {"count": 0}


def note_model_texts(count):
    model_texts["count"] += count


def kept_out_of_vectors():
    """The recall documents MEMORY["EMBED_EPISODE_KINDS"] keeps out of vector recall: episodes whose kind
    (trigger type) it does not list, as a Q; None when every episode is embedded (the default).

    They stay in keyword recall; they are never embedded, so they are not pending either (as the
    seeds' selective indexing: plain Q&A is too high-volume to embed, and floods the vector space)."""
    kinds = memory_settings.EMBED_EPISODE_KINDS
    if kinds is None:
        return None
    embedded = Episode.objects.filter(trigger_type__in=list(kinds)).values("id")
    return Q(kind=RecallKind.EPISODE) & ~Q(item_id__in=embedded)


def _pending(model):
    docs = model.objects.filter(PENDING_VECTOR).order_by()
    kept_out = kept_out_of_vectors() if model is RecallDocument else None
    return docs if kept_out is None else docs.exclude(kept_out)


def pending_documents(model=RecallDocument, *, kind_items=None, ids=None, limit):
    """(id, text) of `model`'s rows without a vector: recall documents of these {kind: item ids}, or
    these row ids.

    Looked up by the (kind, item_id) index or the primary key, and not ordered in SQL: "ORDER BY id"
    made SQLite walk the whole table in id order, reading every stored vector on its way.
    """
    docs = _pending(model)
    chunks = (
        [Q(pk__in=ids[i : i + 500]) for i in range(0, len(ids), 500)]
        if ids is not None
        else [
            Q(kind=kind, item_id__in=sorted(items)[i : i + 500])
            for kind, items in kind_items.items()
            for i in range(0, len(items), 500)
        ]
    )
    found = []
    for match in chunks:
        found += docs.filter(match).values_list("id", "text")
        if len(found) >= limit:
            break
    return sorted(found)[:limit]


def pending_ids(model=RecallDocument):
    """Ids of every row of `model` without a vector (one scan of the table: for a worker's start)."""
    return list(_pending(model).values_list("id", flat=True))


def send_embed_task():
    """After a commit, with a broker: ask the workers to drain what is pending (any of them; a
    duplicate of the task finds nothing left to claim). A broker that is down fails no write: the
    beat's periodic `embed_pending` sweep catches up."""
    try:
        from celery import current_app

        current_app.send_task("memory.embed_pending", ignore_result=True)
    except Exception:  # noqa: BLE001  (any broker failure: the write stands, the sweep embeds it)
        logger.exception("could not queue the embedding task; the periodic sweep will embed the write")


def drain_pending(*, deadline=None):
    """Embed every pending document this process can claim, batch by batch (a Celery worker's task).

    Returns (vectors stored, recall document ids embedded, for their `similar` edges). Stops when a
    batch stores nothing (what is left is held by other workers, or by a forget in progress) or at
    `deadline` (time.monotonic()).
    """
    batch = int(memory_settings.EMBED_BATCH)
    stored, embedded = 0, []
    for model in MODELS:
        while deadline is None or time.monotonic() < deadline:
            ids = unclaimed_pending_ids(_pending(model), batch)
            docs = pending_documents(model, ids=ids, limit=batch) if ids else []
            done = embed_documents(docs, model, link=False) if docs else 0
            if not done:
                break
            stored += done
            if model is RecallDocument:
                embedded += [doc_id for doc_id, _ in docs]
    return stored, embedded


def pending_count():
    """Recall documents and store items waiting for a vector: the current workspace's, if one is
    (/healthz and /metrics of a workspace member; the store items' manager keeps to it already)."""
    workspace_id = current_workspace_id()
    total = 0
    for model in MODELS:
        docs = _pending(model)
        if model is RecallDocument and workspace_id is not None:
            docs = docs.filter(workspace_id=workspace_id)
        total += docs.count()
    return total


class Indexer:
    """The process's embedding worker: a queue of committed (kind, item id)s and the thread that drains it."""

    def __init__(self):
        self._cond = threading.Condition()
        self._queue = {}  # kind -> set of item ids
        self._since = None  # when the oldest queued item was committed (time.monotonic())
        self._thread = None
        self._pid = None
        self._sweep = True  # a new worker first embeds whatever an earlier process left pending
        self._busy = False
        self._unlinked = set()  # recall documents the worker embedded and has not linked yet (its thread's own)
        self._unlinked_since = None
        self._hurry = False  # someone waits for the vectors: link what is embedded without waiting for quiet
        self.failures = 0
        self.last_error = ""
        self.embedded = 0

    # ---- producers

    def schedule(self, kind, item_ids):
        """Embed these items' documents once the current transaction commits (at once outside one)."""
        if configured_mode() != "hybrid":
            return
        if memory_settings.EMBED_ON_WRITE == "inline":
            self._inline(kind, item_ids)
            return
        if memory_settings.TASK_BROKER:  # workers on the broker embed it, whoever claims it first
            transaction.on_commit(send_embed_task)
            return
        ids = list(item_ids)
        transaction.on_commit(lambda: self._enqueue(kind, ids))

    def _inline(self, kind, item_ids):
        try:
            if kind == STORE:
                embed_documents(pending_documents(StoreItem, ids=list(item_ids), limit=len(item_ids)), StoreItem)
            else:
                embed_documents(pending_documents(kind_items={kind: set(item_ids)}, limit=len(item_ids)))
        except EmbeddingModelChanged as exc:
            logger.warning("not embedding %s %s: %s", kind, list(item_ids), exc)

    def _enqueue(self, kind, ids):
        with self._cond:
            was_empty = not self._queue
            if was_empty:
                self._since = time.monotonic()
            self._queue.setdefault(kind, set()).update(ids)
            self._start()
            # Wake the worker only when it has something new to decide: work after none (it waits for
            # work), or a full batch (it waits for one, or for EMBED_WAIT_MS). Waking it on every
            # write made each write hand the GIL over and back.
            if was_empty or self._queued() >= int(memory_settings.EMBED_BATCH):
                self._cond.notify_all()

    def start(self):
        """Start the worker (it sweeps what is pending) if recall is hybrid; cheap when it runs already."""
        if configured_mode() != "hybrid" or memory_settings.EMBED_ON_WRITE == "inline" or memory_settings.TASK_BROKER:
            return
        with self._cond:
            self._start()

    def _start(self):
        if self._thread is not None and self._thread.is_alive() and self._pid == os.getpid():
            return
        if self._pid is not None and self._pid != os.getpid():  # a forked child: the thread stayed behind
            self._queue, self._busy, self._sweep, self._unlinked, self._hurry = {}, False, True, set(), False
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="engram-indexer", daemon=True)
        self._thread.start()

    def _queued(self):
        return sum(len(ids) for ids in self._queue.values())

    # ---- the direct path

    def wait(self, timeout=None):
        """Block until everything committed so far is embedded (or failed); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._hurry = True
            self._cond.notify_all()
            while self._queue or self._busy or self._thread is not None and (self._sweep or self._unlinked):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    # ---- the worker

    def _run(self):
        pause = 0.0
        while True:
            self._wait_for_work()
            with self._cond:
                # Let concurrent writers join the batch: one model call for many texts costs little
                # more than for one (most of a small call is fixed overhead), and every batch is a
                # claim and a store transaction. Counted from the oldest queued write's commit, so a
                # write waits at most EMBED_WAIT_MS for others however long the last batch took. Not
                # when someone waits for the vectors (wait_for_vectors): they want them now.
                oldest = self._since if self._since is not None else time.monotonic()
                gather_until = oldest + float(memory_settings.EMBED_WAIT_MS) / 1000.0
                while (
                    self._queue
                    and not self._hurry
                    and self._queued() < int(memory_settings.EMBED_BATCH)
                    and time.monotonic() < gather_until
                ):
                    self._cond.wait(gather_until - time.monotonic())
                work, self._queue = self._queue, {}
                since, self._since = self._since, None
                sweep, self._busy = self._sweep, True
            try:
                if sweep:
                    self._drain(None)
                # Past its writes' due time, a batch is embedded at the requests' priority.
                due = None if since is None else since + float(memory_settings.EMBED_DUE_MS) / 1000.0
                with vectors_due(due):
                    self._drain(work)
                pause = 0.0
                with self._cond:
                    self._sweep = self._sweep and not sweep
            except EmbeddingModelChanged as exc:  # vectors of another model: only `memory reindex` helps
                logger.warning("not embedding recall documents: %s", exc)
                with self._cond:
                    self._sweep = False
            except Exception as exc:  # noqa: BLE001  (any embedder or database failure: count, retry later)
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                logger.exception("embedding recall documents failed (%d failures so far); retrying", self.failures)
                with self._cond:  # put the work back, to retry after a pause
                    for kind, ids in work.items():
                        self._queue.setdefault(kind, set()).update(ids)
                    if work:
                        self._since = min(t for t in (since, self._since) if t is not None)
                    self._sweep = self._sweep or sweep
                pause = min(MAX_PAUSE_SECONDS, max(1.0, pause * 2))
            finally:
                if pause and not connection.in_atomic_block:
                    connection.close()  # a failed batch may have left the connection broken
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
            if pause:
                time.sleep(pause)

    def _drain(self, work):
        """Embed the pending documents of `work` ({kind: ids}), or, when None, of every document
        pending now (what an earlier process left: read once, so a steady stream of new writes,
        which come through the queue, cannot keep the sweep going)."""
        batch = int(memory_settings.EMBED_BATCH)
        commits_without_flush_wait()  # this thread's own connection
        if work is None:
            for model in MODELS:
                self._embed_rows(model, pending_ids(model), batch)
            return
        work = dict(work)
        self._embed_rows(StoreItem, sorted(work.pop(STORE, ())), batch)
        while work:
            if kept_out_of_vectors() is None:
                stored, docs = embed_items(work, batch)
            else:  # episodes of some kinds are never embedded: the pending ones are read through that filter
                docs = pending_documents(kind_items=work, limit=batch)
                stored = embed_documents(docs, link=False) if docs else 0
            self.embedded += stored
            self._note_unlinked(docs)
            if len(docs) < batch or not stored:  # nothing more, or texts that failed to store: a later pass
                return

    def _embed_rows(self, model, ids, batch):
        for start in range(0, len(ids), batch):
            docs = pending_documents(model, ids=ids[start : start + batch], limit=batch)
            self.embedded += embed_documents(docs, model, link=False)
            if model is RecallDocument:
                self._note_unlinked(docs)

    def _note_unlinked(self, docs):
        if docs and not self._unlinked:
            self._unlinked_since = time.monotonic()
        self._unlinked.update(doc_id for doc_id, _ in docs)

    def _wait_for_work(self):
        """Return once there is work (queued writes, or a sweep due). Meanwhile, once no write has come
        for QUIET_SECONDS (or the oldest unlinked document has waited LINK_AFTER_SECONDS, or someone
        waits for the vectors), link what was embedded, all in one pass, and let go of the connection.

        A link loads the vectors of each document's owner into this process's index and commits the
        edges, and the process's requests share the interpreter and (on SQLite) the write lock with
        it: linking after every batch of a stream of writes held up the writers (bench.webhook,
        bench.facts), so a stream is linked every few seconds and a burst after it.
        """
        while True:
            with self._cond:
                if not (self._queue or self._sweep or self._hurry or self._link_overdue()):
                    self._cond.wait(QUIET_SECONDS)  # in a stream of writes, the next one comes sooner
                work = bool(self._queue or self._sweep)
                if work and len(self._unlinked) < LINK_MAX_WAITING and not self._link_overdue():
                    return
                if not work:  # quiet, or someone waits for the vectors: their edges now
                    self._hurry = False
                linking = bool(self._unlinked)
                self._busy = self._busy or linking
            if linking:
                try:
                    self._link()
                finally:
                    with self._cond:
                        self._busy = False
                        self._cond.notify_all()
            with self._cond:
                if self._queue or self._sweep:
                    return
            if not connection.in_atomic_block:
                connection.close()  # an idle worker holds no connection
            with self._cond:
                while not (self._queue or self._sweep or self._hurry):
                    # Idle for a while: sweep for documents left pending by a process that went away
                    # (or whose claim lapsed), so none waits for a restart.
                    if not self._cond.wait(float(memory_settings.EMBED_SWEEP_SECONDS)):
                        self._sweep = True

    def _link_overdue(self):
        return bool(self._unlinked) and time.monotonic() - self._unlinked_since >= LINK_AFTER_SECONDS

    def _link(self):
        ids, self._unlinked = sorted(self._unlinked), set()
        try:
            commits_without_flush_wait()
            embedder = get_embedder()
            if embedder is not None:
                link_similar_ids(ids, embedder.dimension)  # never raises for the database: edges are hints
        except Exception:  # noqa: BLE001  (an embedder that cannot load now: the edges are hints, the vectors are stored)
            logger.exception("could not link %d embedded documents to similar ones", len(ids))


indexer = Indexer()
