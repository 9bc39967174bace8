"""Hybrid recall: keyword (BM25) and vector (cosine) candidates, fused, put in context, boosted, checked.

How a recall ranks (every weight is a MEMORY setting; see memory/conf.py):

1. Candidates: the RECALL_CANDIDATES best keyword matches among the viewer's owners (SQLite FTS5
   BM25 / PostgreSQL ts_rank normalized by length, over any word of the query, stop words dropped)
   and, with an embedder, the RECALL_CANDIDATES nearest vectors of those owners (exact cosine scan
   of the in-process index). An episode's document is its date in words ("8 May 2023", from
   started_at in UTC), then its summary and messages (migration 0019): a question naming a month, a
   year or a day finds the episodes of that time, whose own words seldom say when they were said.
2. Fusion (RECALL_FUSION "standardized", the default): each leg's scores are standardized,
   z = (score - mean) / std, and clipped at 0; relevance is the sum of the legs' z (one leg in
   "keyword" or "vector" mode). There is no weight to fit: a leg counts per query by how far its
   candidate stands out from the rest, so a leg that has little to say (a long query matching many
   documents by common words; vectors all about equally close) spreads thin, and a leg with a
   clear winner decides. Below the mean a document gets nothing from that leg (it is no evidence
   for it). The keyword leg is standardized over its own list: BM25 scores only the documents
   that share a word with the query, and a document without one has no score (not a low one). A
   cosine is defined for every document, so the vector leg is standardized over the cosines of
   every document being ranked (both legs' candidates and their session neighbours, step 3), not
   over its own list: that list is the top RECALL_CANDIDATES of the leg, whose mean and spread
   depend on that depth and on the store's size, and against it only the very first few stood
   out; against the documents at hand a cosine counts by how far it stands above what the
   question's other candidates get. A
   list whose scores are all equal (one keyword match, say) gives each of its documents 1 (one
   standard deviation: a match the leg cannot rank). Documents below both means keep their order,
   and a positive score, by TIE_BREAK x their raw scores. The older "weighted" fusion,
   w * (bm25 / best bm25) ** p + (1 - w) * cosine (w = RECALL_KEYWORD_WEIGHT 0.6,
   p = RECALL_KEYWORD_POWER 2), was fitted on LoCoMo, where words matter most, and falls below its
   own vector leg on dialog data where meaning matters more; it stays as a setting for comparison
   (bench.retrieval --grid compares both, cross-validated).
3. Session context: an episode's relevance gains RECALL_CONTEXT_WEIGHTS of the relevance of the
   episodes one before, one after, two before and two after it in the same session (a conversation
   stored turn by turn tells its story across turns), and RECALL_SESSION_WEIGHT of the best
   relevance among the session's candidates (sessions are about something).
4. Hygiene: what an episode asks says what someone wanted to know, not what is so. An episode's
   asking share a is the share of its sentences that are questions (its "?" among its ".", "!"
   and "?"; an unended last sentence is one more); its own relevance is multiplied by
   1 - (1 - q) a, q = RECALL_BARE_QUESTION_WEIGHT (1/2): a bare question (a = 1) counts q, a turn
   that only states counts in full, "Wow, congrats! How did it go?" (a = 1/2) in between. This is
   applied after context, so an asking turn still lends its full relevance to its neighbours; and
   what it loses, (1 - q) a x its fused relevance, goes to the turn after it in its session, the
   answer (a question is evidence of where the answer is, not of itself). In a conversation a turn
   that ends by asking hands the word to the other speaker, and what it says before its question
   is mostly an echo of what it reacts to: in dialog data such turns hold less of the evidence than
   their share of the turns, yet crowd the top hits. One constant, q, the same as for
   bare questions (an asking sentence is worth half a stating one), with no new one: the share
   comes from the text, and the answer gets exactly what the question gave up.
   Length: an episode's own relevance is also multiplied by (its length / the median length of the
   episodes being ranked) ** RECALL_LENGTH_EXPONENT (1/4). BM25 normalizes a document's score by
   its length, and a cosine ignores length, so neither says that a turn that says more is more
   likely to hold what is asked for; in IR the chance of relevance grows with a document's length
   (pivoted length normalization), and long turns hold more than their share of a dialog's
   evidence. Relative to the median of the episodes at hand, so a
   typical episode keeps its score against facts and procedures (which keep theirs: a fact is short
   because it is distilled, not because it says little); a quarter power, so a turn 16 times longer
   counts twice. The exponent was chosen by cross-validation over conversations (bench.retrieval --folds).
5. Boost: score = relevance * (1 - b + b * importance * recency * (1 + log2(1 + references) / 8)),
   b = RECALL_BOOST_WEIGHT; importance is a fact's confidence, a procedure's smoothed success rate,
   0.5 for an episode; recency = max(0.1, 1 - age in days / RECALL_RECENCY_DAYS).
6. Visibility: every candidate is checked in the database (owner, kind, active, min confidence,
   shadowing) before it can rank, so a stale vector can never return a hidden or deleted item.
7. Walk (RECALL_WALK_DEPTH hops, 0 by default): documents joined to the hits by the memory graph
   (memory/recall/relations.py) join them, once checked like every candidate, each scored WALK_SHARE (1/2)
   x the edge's weight x the score of the hit it was reached from: a hop is weaker evidence than a
   match, and a neighbour never outranks the hit that led to it. Such hits carry `via`.

Modes: "hybrid" (both legs), "keyword", "vector"; "auto" is hybrid with an embedder, else keyword.
"""

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from ..backends.rows import models_by_id
from ..conf import memory_settings, on_memory_settings_changed
from ..embedding.embedder import EmbeddingModelChanged, get_embedder
from ..exceptions import InvalidMemoryArgument
from ..models import (
    EmbeddingModelRecord,
    Episode,
    Fact,
    Procedure,
    RecallEvent,
    RecallKind,
)
from ..models.workspaces import current_workspace_id
from .relations import neighbours
from .vectors import get_vector_index

logger = logging.getLogger("engram.memory")

MODES = ("auto", "hybrid", "keyword", "vector")
WALK_SHARE = 0.5
ITEM_MODELS = {RecallKind.FACT: Fact, RecallKind.EPISODE: Episode, RecallKind.PROCEDURE: Procedure}


@dataclass(frozen=True)
class RecallHit:
    """One recalled memory: what it is, its text as indexed, its score, and the item itself."""

    kind: str
    id: int
    text: str
    score: float
    item: Any = field(repr=False, compare=False)
    keyword_score: float = 0.0
    vector_score: float | None = None
    # Reached along the memory graph (RECALL_WALK_DEPTH): {"relation", "from": {"kind", "id"}}.
    via: dict | None = None

    def as_dict(self):
        """JSON-serialisable: kind, id, text, score, the leg scores, and the item's main fields."""
        return {
            "kind": self.kind,
            "id": self.id,
            "text": self.text,
            "score": round(self.score, 6),
            "keyword_score": round(self.keyword_score, 6),
            "vector_score": None if self.vector_score is None else round(self.vector_score, 6),
            "via": self.via,
            "item": item_fields(self.kind, self.item),
        }


@dataclass(frozen=True)
class RecallResult:
    """What a recall found, in which mode, and how long the query's embedding took (ms)."""

    hits: list
    mode: str
    embed_ms: float = 0.0
    timings: dict = field(default_factory=dict)

    def __iter__(self):
        return iter(self.hits)

    def __len__(self):
        return len(self.hits)

    def __getitem__(self, index):
        return self.hits[index]


def item_fields(kind, item):
    def iso(value):
        return value.isoformat() if value else None

    if kind == RecallKind.FACT:
        return {
            "key": item.key,
            "value": item.value,
            "fact_type": item.fact_type,
            "scope": item.scope,
            "scope_key": item.scope_key,
            "confidence": round(item.confidence, 4),
            "updated_at": iso(item.updated_at),
            "valid_from": iso(item.valid_time[0]),
            "valid_to": iso(item.valid_time[1]),
        }
    if kind == RecallKind.EPISODE:
        return {
            "agent_id": item.agent_id,
            "user_id": item.user_id,
            "session_id": item.session_id,
            "trigger_type": item.trigger_type,
            "trigger_input": item.trigger_input,
            "summary": item.summary,
            "conversation": item.conversation,
            "success": item.success,
            "started_at": iso(item.started_at),
        }
    return {
        "agent_id": item.agent_id,
        "name": item.name,
        "description": item.description,
        "procedure_type": item.procedure_type,
        "content": item.content,
        "success_rate": round(item.success_rate, 4),
        "is_active": item.is_active,
    }


def item_text(kind, item):
    """The text a hit shows: a fact as "key: value", an episode's summary or conversation, a procedure's name and description."""
    if kind == RecallKind.FACT:
        value = item.value if isinstance(item.value, str) else str(item.value)
        return f"{item.key}: {value}"
    if kind == RecallKind.EPISODE:
        lines = [item.summary] if item.summary else []
        for message in item.conversation or []:
            if isinstance(message, dict):
                role, content = message.get("role", ""), message.get("content", "")
                lines.append(f"{role}: {content}" if role else str(content))
        return "\n".join(lines)
    return f"{item.name}: {item.description}" if item.description else item.name


# ---------------------------------------------------------------- embedding model record


class ModelGuard:
    """Checks once per process that stored vectors were made by the configured model; records it first."""

    def __init__(self):
        self._lock = threading.Lock()
        self._checked = None

    def check(self, embedder):
        key = (embedder.model, embedder.dimension)
        if self._checked == key:
            return
        with self._lock:
            record = EmbeddingModelRecord.objects.order_by("pk").first()
            if record is None:
                EmbeddingModelRecord.objects.create(model=embedder.model, dimension=embedder.dimension)
            elif (record.model, record.dimension) != key:
                raise EmbeddingModelChanged(record.model, record.dimension, embedder.model, embedder.dimension)
            self._checked = key

    def reset(self):
        with self._lock:
            self._checked = None


model_guard = ModelGuard()


# ---------------------------------------------------------------- ranking


def boost(importance, item_seconds, references, now_seconds):
    """importance x recency x reference boost, in 0..~1.6. Times are Unix seconds."""
    recency = 1.0
    if item_seconds is not None:
        days = max(0.0, (now_seconds - float(item_seconds)) / 86400.0)
        recency = max(0.1, 1.0 - days / float(memory_settings.RECALL_RECENCY_DAYS))
    return importance * recency * (1.0 + math.log2(1 + (references or 0)) / 8.0)


class Recaller:
    """One recall, step by step; MemoryService.recall builds it after checking the arguments."""

    def __init__(self, backend, viewer, query, terms, kinds, limit, min_confidence, mode):
        self.backend = backend
        self.viewer = viewer
        self.query = query
        self.terms = terms
        self.kinds = kinds
        self.limit = limit
        self.min_confidence = min_confidence
        self.requested_mode = mode
        self.embed_ms = 0.0
        # Milliseconds per stage of the last run (for benchmarks and debugging).
        self.timings = {}
        self._clock = time.perf_counter()

    def _lap(self, stage):
        now = time.perf_counter()
        self.timings[stage] = self.timings.get(stage, 0.0) + (now - self._clock) * 1000.0
        self._clock = now

    def run(self):
        fusion = _fusion()
        embedder = None
        mode = self.requested_mode
        if mode != "keyword":
            embedder = get_embedder()
            if embedder is None:
                if mode in ("hybrid", "vector"):
                    raise InvalidMemoryArgument("mode", f"{mode!r} needs an embedder; recall is keyword-only here")
                mode = "keyword"
            elif mode == "auto":
                mode = "hybrid"
        query_vector = None
        if mode in ("hybrid", "vector"):
            model_guard.check(embedder)
            query_vector = embedder.query_soon(self.query)  # overlaps the database work below
        self._clock = time.perf_counter()
        owners = self.backend.recall_owners(self.viewer, *_owner_sql())
        owner_names = [o for o, _, _, _ in owners]
        self._lap("owners")
        depth = max(int(memory_settings.RECALL_CANDIDATES), self.limit)

        keyword = {}
        if mode in ("hybrid", "keyword") and self.terms:
            keyword = dict(self.backend.recall_keyword(self.terms, owner_names, depth))
        self._lap("keyword")
        vector, index = {}, None
        if mode in ("hybrid", "vector"):
            index = get_vector_index(embedder.dimension)
            index.sync({o: (g, rm) for o, _, g, rm in owners})
            self._lap("sync")
            query_vector = query_vector.result()  # what is left of the embedding once the database answered
            self._lap("embed")
            self.embed_ms = self.timings["embed"]
            vector = dict(index.search(owner_names, query_vector, depth, current_workspace_id()))
            missing = [d for d in keyword if d not in vector]
            if missing:
                vector.update(index.cosines(owner_names, missing, query_vector))
            self._lap("vector")

        self.doc_ids = []
        candidates = set(keyword) | set(vector)
        weights = [float(x) for x in memory_settings.RECALL_CONTEXT_WEIGHTS]
        session_weight = float(memory_settings.RECALL_SESSION_WEIGHT)
        question_weight = float(memory_settings.RECALL_BARE_QUESTION_WEIGHT)
        around = {}
        context = any(weights) or session_weight or question_weight < 1
        if candidates and RecallKind.EPISODE in self.kinds and context:
            # Episodes around the candidates in their sessions: context for them, and candidates
            # themselves (the turn that answers often shares no word with the question).
            around = _relations(self.backend.recall_neighbours(sorted(candidates)))
        self._lap("neighbours")
        extra = [d for d in around if d not in candidates]
        rows = self.backend.recall_documents(
            sorted(candidates.union(extra)),
            [(o, r) for o, r, _, _ in owners],
            self.kinds,
            self.min_confidence,
            for_person=self.viewer.user_id is not None,
        )
        self._lap("check")
        if not rows:
            return mode, []
        if index is not None:
            outside = [d for d in extra if d not in vector]
            if outside:
                vector.update(index.cosines(owner_names, outside, query_vector))
        best_keyword = max(keyword.values(), default=0.0) or 1.0
        fused = _fuse(fusion, mode, rows, keyword, best_keyword, vector)
        ranked = dict(fused)
        session_best = {}
        for doc_id, (session, _) in around.items():
            if doc_id in fused:
                session_best[session] = max(session_best.get(session, 0.0), fused[doc_id])
        for doc_id, (session, near) in around.items():
            if doc_id in fused:
                ranked[doc_id] = (
                    fused[doc_id]
                    + sum(wt * fused.get(n, 0.0) for wt, n in zip(weights, near) if wt and n is not None)
                    + session_weight * session_best[session]
                )
                before = near[0]
                if before in fused and rows[before][6]:
                    # What the turn before loses for asking (step 4) goes to this turn, its answer.
                    ranked[doc_id] += (1.0 - question_weight) * rows[before][6] * fused[before]
        now = timezone.now().timestamp()
        b = float(memory_settings.RECALL_BOOST_WEIGHT)
        exponent = float(memory_settings.RECALL_LENGTH_EXPONENT)
        episode = RecallKind.EPISODE.value  # a plain str: compared once per candidate
        lengths = sorted(row[7] for row in rows.values() if row[0] == episode) if exponent else []
        # (length / median) ** exponent, as length ** exponent x this
        per_length = max(lengths[len(lengths) // 2], 1) ** -exponent if lengths else 0.0
        scored = []
        for doc_id, rel in ranked.items():
            kind, _item_id, _owner, importance, item_time, references, asking, length = rows[doc_id]
            rel *= 1.0 - (1.0 - question_weight) * asking
            if per_length and kind == episode:
                rel *= max(length, 1) ** exponent * per_length
            scored.append((rel * (1.0 - b + b * boost(importance, item_time, references, now)), doc_id))
        scored.sort(key=lambda s: (-s[0], s[1]))
        top = scored[: self.limit]
        via = {}
        if int(memory_settings.RECALL_WALK_DEPTH) > 0 and top:
            top, via = self._walk(top, scored, rows, owners, int(memory_settings.RECALL_WALK_DEPTH))
        self._lap("rank")
        items = self._items([rows[d][:2] for _, d in top])
        self._lap("items")
        hits, doc_ids = [], []
        for score, doc_id in top:
            kind, item_id = rows[doc_id][:2]
            item = items.get((kind, item_id))
            if item is None:  # deleted between the two statements
                continue
            hits.append(
                RecallHit(
                    kind=kind,
                    id=item_id,
                    text=item_text(kind, item),
                    score=score,
                    item=item,
                    keyword_score=keyword.get(doc_id, 0.0) / best_keyword,
                    vector_score=vector.get(doc_id) if query_vector is not None else None,
                    via=_via(via.get(doc_id), rows),
                )
            )
            doc_ids.append(doc_id)
        self.doc_ids = doc_ids
        return mode, hits

    def _walk(self, top, scored, rows, owners, depth):
        """`top` joined by the documents up to `depth` hops away along the memory graph that the
        viewer may see (checked as every candidate is), each scored WALK_SHARE x the edge's weight x
        the score of the hit it was reached from; the best `limit` kept. Candidates ranked directly
        keep their own score. Returns (top, {document: (relation, the document it was reached from)})."""
        scores = {doc_id: score for score, doc_id in top}
        direct = {doc_id for _, doc_id in scored}
        via, frontier = {}, list(scores)
        for _ in range(depth):
            reached = {}
            for doc_id, edges in neighbours(frontier).items():
                for other, relation, weight in edges:
                    score = scores[doc_id] * weight * WALK_SHARE
                    if other not in direct and other not in scores and score > reached.get(other, (0.0,))[0]:
                        reached[other] = (score, relation, doc_id)
            if not reached:
                break
            visible = self.backend.recall_documents(
                sorted(reached),
                [(o, r) for o, r, _, _ in owners],
                self.kinds,
                self.min_confidence,
                for_person=self.viewer.user_id is not None,
            )
            rows.update(visible)
            for doc_id in visible:
                scores[doc_id], relation, parent = reached[doc_id]
                via[doc_id] = (relation, parent)
            frontier = list(visible)
        ranked = sorted(((score, doc_id) for doc_id, score in scores.items()), key=lambda s: (-s[0], s[1]))
        return ranked[: self.limit], via

    def _items(self, keys):
        by_kind = {}
        for kind, item_id in keys:
            by_kind.setdefault(kind, []).append(item_id)
        items = {}
        for kind, ids in by_kind.items():
            for pk, item in models_by_id(ITEM_MODELS[kind], ids).items():
                items[(kind, pk)] = item
        return items


FUSIONS = ("standardized", "weighted")
# Clipping ties every document below both lists' means at 0: they keep their order (and a positive
# score) by this share of their raw scores, too small to reorder documents a leg stands behind.
TIE_BREAK = 1e-3


def _fusion():
    fusion = memory_settings.RECALL_FUSION
    if fusion not in FUSIONS:
        raise ImproperlyConfigured(f"MEMORY['RECALL_FUSION'] must be one of {', '.join(FUSIONS)}, not {fusion!r}")
    return fusion


def _fuse(fusion, mode, rows, keyword, best, vector):
    """{document: relevance} of the candidates `rows` from the legs' scores (module docstring, step 2);
    `best` is the best keyword score (1 when there is none); `vector` holds the cosine of every
    candidate that has a vector."""
    use_keyword, use_vector = mode in ("hybrid", "keyword"), mode in ("hybrid", "vector")
    if fusion == "weighted":
        w = float(memory_settings.RECALL_KEYWORD_WEIGHT) if mode == "hybrid" else (1.0 if use_keyword else 0.0)
        power = float(memory_settings.RECALL_KEYWORD_POWER)
        return {d: w * (keyword.get(d, 0.0) / best) ** power + (1.0 - w) * max(vector.get(d, 0.0), 0.0) for d in rows}
    keyword_z = _standardizer(keyword.values()) if use_keyword else None
    # The cosines of every document ranked (not only of the vector leg's own list): see step 2.
    vector_z = _standardizer(max(vector[d], 0.0) for d in rows if d in vector) if use_vector else None
    fused = {}
    for d in rows:
        kw = keyword.get(d, 0.0) if use_keyword else 0.0
        cos = max(vector.get(d, 0.0), 0.0) if use_vector else 0.0
        z = (keyword_z(kw) if keyword_z and kw else 0.0) + (vector_z(cos) if vector_z else 0.0)
        fused[d] = z + TIE_BREAK * (kw / best + cos)
    return fused


def _standardizer(scores):
    """score -> max(0, (score - mean) / std) over one leg's candidate list; 1 at or above the mean
    when the list cannot rank (empty, one score, all equal)."""
    values = list(scores)
    if not values:
        return None
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    if std <= 1e-12 * max(1.0, abs(mean)):
        return lambda score: 1.0 if score >= mean else 0.0
    return lambda score: max(0.0, (score - mean) / std)


def _relations(neighbours):
    """{doc: (session, [one before, one after, two before, two after])} for the queried episodes and,
    as far as the answer tells, for their neighbours too (b1's one-before is b2, and so on)."""
    around = {d: (session, list(near)) for d, (session, near) in neighbours.items()}
    derived = {}
    for doc_id, (session, (b1, a1, b2, a2)) in neighbours.items():
        for target, slot, value in (
            (b1, 1, doc_id),
            (b1, 0, b2),
            (b1, 3, a1),
            (a1, 0, doc_id),
            (a1, 1, a2),
            (a1, 2, b1),
            (b2, 3, doc_id),
            (b2, 1, b1),
            (a2, 2, doc_id),
            (a2, 0, a1),
        ):
            if target is not None and value is not None and target not in around:
                derived.setdefault(target, (session, [None] * 4))[1][slot] = value
    around.update(derived)
    return around


def _via(reached, rows):
    if reached is None:
        return None
    relation, parent = reached
    kind, item_id = rows[parent][:2]
    return {"relation": relation, "from": {"kind": kind, "id": item_id}}


def viewer_owners(backend, viewer):
    """The owners whose documents this viewer may see (as recall sees them)."""
    return [owner for owner, _, _, _ in backend.recall_owners(viewer, *_owner_sql())]


def _owner_sql():
    from ..backends.base import USER_OWNER_SQL, owner_terms

    return owner_terms, USER_OWNER_SQL


def recall_events(result_hits, viewer, query, mode, now):
    return [
        RecallEvent(
            created_at=now,
            agent_id=viewer.agent_id,
            user_id=viewer.user_id,
            session_id=viewer.session_id,
            query=query,
            kind=hit.kind,
            item_id=hit.id,
            rank=rank,
            score=hit.score,
            mode=mode,
        )
        for rank, hit in enumerate(result_hits, start=1)
    ]


on_memory_settings_changed(model_guard.reset)
