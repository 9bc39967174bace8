"""Who embeds a pending document: a lease in the database, so that each text is embedded once across processes.

Every process that embeds (each server's embedding worker, Celery workers, `memory reindex --missing`)
takes the documents of a batch through `claim` first: one EmbeddingClaim row per document, unique per
(source, row), inserted in one statement whose ON CONFLICT takes over only a lease past its
`claimed_until` (its worker died); what another worker holds is skipped. The embedding worker's
queue holds items, not rows: its claim finds their pending documents itself (`take_items`). The
texts are then read again, after the claim committed, so a document another worker embedded and
released meanwhile is not embedded a second time; the vector is stored only where the document is
still pending, with the same text, under the same claim (`store_sql`), and the claim goes in that
same transaction.

The claim is in the database rather than in a broker because brokers deliver a task at least once,
and because writers that run no broker (the embedded default, a `manage.py` command) share the same
backlog.

With the logger "engram.memory.embedded" at DEBUG, each process logs the document versions it gives
the model (`note_embedding`): source, then id:digest of the text:pieces for each. Off by default;
`python -m bench.cluster` turns it on to count how often each version was embedded across processes.
"""

import hashlib
import logging
import os
import socket
import uuid
from datetime import timedelta

from django.db import OperationalError, connection, transaction
from django.utils import timezone

from ..conf import memory_settings
from ..models import EmbeddingClaim, RecallDocument

RECALL, STORE = "recall", "store"
_HOST = socket.gethostname()[:40]
embedded_log = logging.getLogger("engram.memory.embedded")


def source_of(model):
    return RECALL if model is RecallDocument else STORE


def new_token():
    """A claimer's name: host, process and a random part (a claim of one batch)."""
    return f"{_HOST}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def claim(model, ids, token, *, seconds=None):
    """Claim these rows of `model` for `token`; returns the ids it holds now (a subset).

    One short transaction, never inside another one (the claim must commit before the model runs).
    Ids are inserted in order, so two claimers of overlapping batches wait for each other rather
    than deadlock; a deadlock of the expired-lease takeover (PostgreSQL) is retried.
    """
    if not take(model, ids, token, seconds=seconds):
        return set()
    return set(
        EmbeddingClaim.objects.filter(source=source_of(model), claimed_by=token).values_list("row_id", flat=True)
    )


def claimed_texts(model, token):
    """(id, text) of the rows of `model` that `token` holds and that are still pending, by id: what
    the claimer embeds, read after its claim committed (one query, where `claim` and a read of the
    texts would be two)."""
    table = connection.ops.quote_name(model._meta.db_table)
    claims = connection.ops.quote_name(EmbeddingClaim._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT d.id, d.text FROM {claims} c JOIN {table} d ON d.id = c.row_id "
            f"WHERE c.source = %s AND c.claimed_by = %s AND d.embedding IS NULL AND d.text <> '' ORDER BY d.id",
            [source_of(model), token],
        )
        return [tuple(row) for row in cursor.fetchall()]


def take(model, ids, token, *, seconds=None):
    """The claim's transaction (see `claim`) without reading back what it won; False when `ids` is empty."""
    ids = sorted(set(ids))
    if not ids:
        return False
    seconds = float(memory_settings.EMBED_CLAIM_SECONDS if seconds is None else seconds)
    source = source_of(model)
    # Plain statements: an embedding worker claims a batch for every few writes, and the ORM's
    # bulk_create spent more of the interpreter than the database did (the requests of its process
    # wait for the interpreter meanwhile).
    table = connection.ops.quote_name(EmbeddingClaim._meta.db_table)
    for attempt in range(3):
        now = timezone.now()
        expired, until = (connection.ops.adapt_datetimefield_value(t) for t in (now, now + timedelta(seconds=seconds)))
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                for start in range(0, len(ids), 500):
                    chunk = ids[start : start + 500]
                    cursor.execute(
                        f"INSERT INTO {table} (source, row_id, claimed_by, claimed_until) VALUES "
                        f"{', '.join(['(%s, %s, %s, %s)'] * len(chunk))} {_TAKE_OVER.format(table=table)}",
                        [*(value for i in chunk for value in (source, i, token, until)), expired],
                    )
            break
        except OperationalError:
            if attempt == 2 or connection.in_atomic_block:
                raise
    return True


# A row free, or held by a lease that lapsed (its worker died), is this claimer's; a live lease is
# left alone. One statement: the lapsed leases are taken over where they conflict.
_TAKE_OVER = (
    "ON CONFLICT (source, row_id) DO UPDATE SET claimed_by = excluded.claimed_by, "
    "claimed_until = excluded.claimed_until WHERE {table}.claimed_until < %s"
)


def take_items(kind_items, token, limit, *, seconds=None):
    """Claim, in one statement, up to `limit` pending recall documents of these {kind: item ids}, in id
    order, for `token` (what the embedding worker's queue holds: items, not document ids). The
    claimer then reads what it won (`claimed_texts`); one short transaction, never inside another."""
    seconds = float(memory_settings.EMBED_CLAIM_SECONDS if seconds is None else seconds)
    table = connection.ops.quote_name(EmbeddingClaim._meta.db_table)
    docs = connection.ops.quote_name(RecallDocument._meta.db_table)
    match, params = [], []
    for kind, items in sorted(kind_items.items()):
        items = sorted(items)
        for start in range(0, len(items), 500):
            chunk = items[start : start + 500]
            match.append(f"(kind = %s AND item_id IN ({', '.join(['%s'] * len(chunk))}))")
            params += [kind, *chunk]
    if not match:
        return
    now = timezone.now()
    expired, until = (connection.ops.adapt_datetimefield_value(t) for t in (now, now + timedelta(seconds=seconds)))
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (source, row_id, claimed_by, claimed_until) "
            f"SELECT %s, id, %s, %s FROM {docs} WHERE ({' OR '.join(match)}) "
            f"AND embedding IS NULL AND text <> '' ORDER BY id LIMIT %s {_TAKE_OVER.format(table=table)}",
            [RECALL, token, until, *params, int(limit), expired],
        )


def commits_without_flush_wait():
    """PostgreSQL: this connection's commits stop waiting for the WAL flush (for the rest of its session).

    For a connection of the embedding worker's own (its thread's): its claims, stored vectors and
    edges. A flush cost each of its commits 2-14 ms on a shared 2-core machine, and the writers of
    the process commit into the same WAL: two flushes a batch (claim, vectors) that sat in the queue
    of their commits. What a database crash can lose is the last fraction of a second of those:
    claims (leases, which lapse anyway) and vectors, whose documents are pending again and embedded
    by the next sweep, never a memory. SQLite in WAL mode with synchronous=NORMAL (the site's
    setting) already commits so. One statement per connection: the worker remembers which one it set.
    """
    if connection.vendor != "postgresql":
        return
    connection.ensure_connection()
    if getattr(connection, "_engram_flush_wait_off", None) is connection.connection:
        return
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit TO OFF")
    connection._engram_flush_wait_off = connection.connection


def release(token):
    """Drop what `token` still holds (a batch that failed: another worker may take it at once)."""
    with connection.cursor() as cursor:  # a plain statement, as in `take`
        cursor.execute(
            f"DELETE FROM {connection.ops.quote_name(EmbeddingClaim._meta.db_table)} WHERE claimed_by = %s", [token]
        )
        return max(cursor.rowcount, 0)


def unclaimed_pending_ids(pending, limit):
    """Ids of up to `limit` rows of `pending` (a queryset of one model's pending rows) that no live
    claim holds: what a worker may take."""
    held = EmbeddingClaim.objects.filter(source=source_of(pending.model), claimed_until__gte=timezone.now())
    return list(pending.exclude(pk__in=held.values("row_id")).order_by().values_list("id", flat=True)[:limit])


def store_sql(model):
    """The UPDATE that stores one vector: parameters (blob, id, text, token). Only a document still
    pending, with the text that was embedded, under this claimer's claim."""
    table = connection.ops.quote_name(model._meta.db_table)
    claims = connection.ops.quote_name(EmbeddingClaim._meta.db_table)
    return (
        f"UPDATE {table} SET embedding = %s WHERE id = %s AND embedding IS NULL AND text = %s "
        f"AND EXISTS (SELECT 1 FROM {claims} c WHERE c.source = '{source_of(model)}' "
        f"AND c.row_id = {table}.id AND c.claimed_by = %s)"
    )


def note_embedding(model, docs):
    """Log (DEBUG, "engram.memory.embedded") the (id, text) versions of `model` about to be embedded:
    ids and a digest of each text (never the text), with its number of pieces."""
    if not embedded_log.isEnabledFor(logging.DEBUG):
        return
    from ..embedding.embedder import split_pieces, without_date_line

    words = int(memory_settings.EMBED_PIECE_WORDS)
    versions = (
        f"{doc_id}:{text_digest(text)}:{len(split_pieces(without_date_line(text), words)) if model is RecallDocument else 1}"
        for doc_id, text in docs
    )
    embedded_log.debug("%s %s", source_of(model), " ".join(versions))


def text_digest(text):
    """A short digest that tells versions of a document's text apart (note_embedding, bench.cluster)."""
    return hashlib.sha1(text.encode()).hexdigest()[:12]
