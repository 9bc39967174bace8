"""The memory graph: edges between recall documents, off the write path.

- `similar`: once the embedding worker has stored vectors (after the writes committed, in its own
  short transaction) and no more writes wait for it (memory/recall/indexer.py: a burst is linked after it,
  within seconds), it links each document to its RELATIONS["SIMILAR_TOP"] closest documents of the
  same owner whose cosine is at least RELATIONS["SIMILAR_MIN_COSINE"]; the weight is the cosine.
  Same owner only, so an edge never joins two people's memories.
- `supports`: consolidation links each fact it wrote to the episode it was distilled from (weight 1),
  in the consolidation's own transaction.
- `contradicts`: a write that replaced a fact's value links the fact to the version of the value it
  replaced (fact history, memory/domain/history.py), after the write has committed (nothing is added to the
  write's transaction), in batches (ContradictionLog). Without history there is nothing to link.

Recall may walk MEMORY["RECALL_WALK_DEPTH"] hops (0, the default: none) from its hits along edges in
either direction; a document reached that way is shown only if the viewer may see it (the same check
as every candidate) and is marked with the hit it came from. Deleting a memory deletes its edges
(a trigger on the documents, migration 0015). The health metric "reachability" is the share of facts
with at least one edge (memory/operations/health.py).
"""

import logging

import numpy as np
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.models import Q
from django.utils import timezone

from ..backends.base import VERSION_TABLE
from ..backends.rows import fetch_in_chunks, held_rows
from ..buffers import WriteBuffer
from ..conf import memory_settings
from ..embedding.embedder import from_blobs
from ..models import FACT_HISTORY_VIEW, FactAction, MemoryRelation, RecallDocument, RecallScope, Relation
from ..rules.validation import chunks

logger = logging.getLogger("engram.memory")


def link_similar(docs):
    """Link each (document id, piece vectors) to its closest documents of the same owner and workspace
    (owners but a person's are the same text in every workspace); returns edges written.

    Call outside any transaction, after the vectors are stored (the search reads them back through the
    process's vector index). Never raises: the edges are a hint, the memories are already stored.
    """
    conf = memory_settings.RELATIONS
    if not conf["SIMILAR"] or not docs:
        return 0
    from .vectors import get_vector_index

    try:
        rows = RecallDocument.objects.filter(pk__in=[d for d, _ in docs]).values_list("id", "owner", "workspace_id")
        owners = {doc_id: (owner, workspace) for doc_id, owner, workspace in rows}
        states = {
            owner: (generation, removed)
            for owner, generation, removed in RecallScope.objects.filter(
                owner__in={owner for owner, _ in owners.values()}
            ).values_list("owner", "generation", "removed")
        }
        dimension = docs[0][1].shape[-1]
        index = get_vector_index(dimension)
        index.sync(states)
        top, floor = int(conf["SIMILAR_TOP"]), conf["SIMILAR_MIN_COSINE"]
        by_owner = {}
        for doc_id, pieces in docs:
            if doc_id in owners:  # else deleted meanwhile
                query = pieces.mean(axis=0)
                by_owner.setdefault(owners[doc_id], []).append((doc_id, query / (np.linalg.norm(query) or 1.0)))
        edges = []
        for (owner, workspace), group in by_owner.items():
            queries = np.stack([query for _, query in group]).astype(np.float32)
            similar = index.search_owner(owner, queries, top + 1, workspace)  # + 1: itself
            for (doc_id, _), found in zip(group, similar):
                close = [(other, cos) for other, cos in found if other != doc_id and cos >= floor]
                edges += [
                    MemoryRelation(source_id=doc_id, target_id=other, relation=Relation.SIMILAR, weight=cosine)
                    for other, cosine in close[:top]
                ]
        if edges:
            with transaction.atomic():
                # Only between documents that still exist (one may have gone since the search) and
                # that no other transaction is deleting: an edge's foreign keys would wait for it.
                alive = held_rows(
                    RecallDocument, {e.source_id for e in edges} | {e.target_id for e in edges}, lock="KEY SHARE"
                )
                edges = [e for e in edges if e.source_id in alive and e.target_id in alive]
                MemoryRelation.objects.bulk_create(edges, ignore_conflicts=True)
        return len(edges)
    except DatabaseError as exc:
        logger.warning("could not link %d documents to similar ones: %s", len(docs), exc)
        return 0


def link_similar_ids(doc_ids, dimension, *, batch_size=256, progress=None):
    """`similar` edges of these documents from the vectors they have stored now (a document without
    one is skipped); returns the edges written. `progress(done, total)` after each batch."""
    written = 0
    for start in range(0, len(doc_ids), batch_size):
        chunk = doc_ids[start : start + batch_size]
        # Vectors as binary results on PostgreSQL (fetch_in_chunks), as the vector index reads them.
        sql = (
            f"SELECT id, embedding FROM {RecallDocument._meta.db_table} "
            f"WHERE id IN ({', '.join(['%s'] * len(chunk))}) AND embedding IS NOT NULL"
        )
        docs = [
            (pk, from_blobs([blob], dimension)) for rows in fetch_in_chunks(sql, chunk, batch_size) for pk, blob in rows
        ]
        written += link_similar(docs)
        if progress:
            progress(min(start + batch_size, len(doc_ids)), len(doc_ids))
    return written


def relink_similar(doc_ids, dimension, *, batch_size=256, progress=None):
    """Rebuild the `similar` edges of these documents from their stored vectors (after a reindex);
    returns the edges written. `progress(done, total)` after each batch."""
    MemoryRelation.objects.filter(relation=Relation.SIMILAR, source_id__in=doc_ids).delete()
    return link_similar_ids(doc_ids, dimension, batch_size=batch_size, progress=progress)


def link_supports(fact_episode_pairs):
    """`supports` edges from each fact's document to its episode's (inside the caller's transaction)."""
    pairs = [(f, e) for f, e in fact_episode_pairs if f is not None and e is not None]
    if not pairs:
        return 0
    wanted = Q()
    for fact_id, episode_id in pairs:
        wanted |= Q(kind="fact", item_id=fact_id) | Q(kind="episode", item_id=episode_id)
    docs = {(k, i): pk for pk, k, i in RecallDocument.objects.filter(wanted).values_list("id", "kind", "item_id")}
    edges = [
        MemoryRelation(source_id=docs[("fact", f)], target_id=docs[("episode", e)], relation=Relation.SUPPORTS)
        for f, e in pairs
        if ("fact", f) in docs and ("episode", e) in docs
    ]
    MemoryRelation.objects.bulk_create(edges, ignore_conflicts=True)
    return len(edges)


class ContradictionLog(WriteBuffer):
    """Facts whose value a committed write replaced, waiting for their `contradicts` edges.

    Buffered (memory/buffers.py) like access counts: one edge cost a bulk writer a transaction of
    its own per replaced value (on PostgreSQL a WAL flush), as much as fact history itself. The edges
    are derived from fact history (link_contradictions), so a batch lost with a killed process is
    rebuilt by `memory reindex` and the next write of the fact.
    """

    what = "facts' contradicts edges"

    def empty(self):
        return set()

    def limit(self):
        return CONTRADICTIONS_FLUSH_PENDING

    def note(self, fact_id):
        """Call once the write that replaced `fact_id`'s value has committed (never inside a transaction)."""
        self.add(lambda pending: pending.add(fact_id))

    def write(self, fact_ids):
        return link_contradictions(fact_ids)


CONTRADICTIONS_FLUSH_PENDING = 200
contradictions = ContradictionLog()


def link_contradictions(fact_ids=None):
    """A `contradicts` edge from each fact's document to the version before each of its `updated`
    versions (the value that write replaced): of these facts, or of every fact when None.

    One statement per chunk of ids, in the database; edges already there are kept (one per version),
    so it can run again at any time (`memory reindex` does, to rebuild what a killed process had not
    written). Returns the edges added.
    """
    conn = connections[DEFAULT_DB_ALIAS]
    stamp = _CREATED_AT.get_db_prep_save(timezone.now(), conn)
    ids = sorted(set(fact_ids)) if fact_ids is not None else None
    added = 0
    with conn.cursor() as cursor:
        for chunk in [None] if ids is None else chunks(ids):
            where = "" if chunk is None else f"v.fact_id IN ({', '.join(['%s'] * len(chunk))}) AND "
            cursor.execute(
                _CONTRADICTION_SQL.format(where=where),
                [Relation.CONTRADICTS, stamp, *(chunk or ()), FactAction.UPDATED],
            )
            added += max(cursor.rowcount, 0)
    return added


_CREATED_AT = MemoryRelation._meta.get_field("created_at")
# The version before v (a stored version, or a fact's current one): the latest stored version of the
# same fact earlier in (valid_from, id) order.
# The WHERE before ON CONFLICT also keeps SQLite from reading ON as a join's (its upsert rule).
_CONTRADICTION_SQL = (
    f"INSERT INTO {MemoryRelation._meta.db_table} (source_id, target_id, target_version_id, relation, weight, created_at) "
    f"SELECT d.id, NULL, p.id, %s, 1.0, %s FROM {FACT_HISTORY_VIEW} v, {RecallDocument._meta.db_table} d, {VERSION_TABLE} p "
    "WHERE {where}v.action = %s AND d.kind = 'fact' AND d.item_id = v.fact_id AND p.id = ("
    f"SELECT q.id FROM {VERSION_TABLE} q WHERE q.fact_id = v.fact_id AND (q.valid_from < v.valid_from "
    "OR q.valid_from = v.valid_from AND q.id < v.id) ORDER BY q.valid_from DESC, q.id DESC LIMIT 1) "
    "ON CONFLICT DO NOTHING"
)


def neighbours(doc_ids):
    """{document id: [(neighbour id, relation, weight)]} over edges in either direction."""
    found = {}
    if not doc_ids:
        return found
    rows = (
        MemoryRelation.objects.filter(Q(source_id__in=doc_ids) | Q(target_id__in=doc_ids))
        .filter(target__isnull=False)  # a replaced value is history, not something to recall
        .values_list("source_id", "target_id", "relation", "weight")
    )
    wanted = set(doc_ids)
    for source, target, relation, weight in rows:
        if source in wanted:
            found.setdefault(source, []).append((target, relation, weight))
        if target in wanted:
            found.setdefault(target, []).append((source, relation, weight))
    return found


def relations_of(kind, item_id):
    """[(direction, relation, weight, other kind, other id)] of one memory, strongest first; the other
    of a `contradicts` edge is ("fact_version", version id)."""
    contradictions.flush()  # what this process's writes replaced, before it is read
    doc = RecallDocument.objects.filter(kind=kind, item_id=item_id).values_list("id", flat=True).first()
    if doc is None:
        return []
    edges = MemoryRelation.objects.filter(Q(source_id=doc) | Q(target_id=doc)).select_related("source", "target")
    result = []
    for edge in edges:
        outgoing = edge.source_id == doc
        if edge.target_version_id is not None:
            result.append(("to", edge.relation, edge.weight, "fact_version", edge.target_version_id))
            continue
        other = edge.target if outgoing else edge.source
        result.append(("to" if outgoing else "from", edge.relation, edge.weight, other.kind, other.item_id))
    return result
