"""Recall as MemoryService offers it: recall() and what a viewer may list and forget (Recall), and the
recall index's upkeep: embedding after writes, reindexing, compacting (RecallIndex)."""

import logging
from dataclasses import replace

from django.db import transaction
from django.utils import timezone

from ..conf import memory_settings
from ..embedding.embedder import (
    EmbeddingModelChanged,
    configured_mode,
    get_embedder,
    reset_embedder,
    to_blob,
)
from ..exceptions import InvalidMemoryArgument, MemoryServiceError
from ..models import EmbeddingModelRecord, Episode, FactType, Procedure, RecallDocument, RecallKind, holds
from ..rules.validation import check_choice, check_int, check_limit, check_unit_interval, clean_text, make_viewer
from ..text import keyword_terms
from .access import access_counter
from .events import recall_log
from .indexer import embed_documents, indexer, kept_out_of_vectors, pending_count, pending_documents
from .ranking import MODES, Recaller, RecallResult, item_text, model_guard, recall_events, viewer_owners
from .relations import link_contradictions, relations_of, relink_similar
from .vectors import reset_vector_index

logger = logging.getLogger("engram.memory")

RECALL_TYPES = {
    "facts": RecallKind.FACT,
    "fact": RecallKind.FACT,
    "episodes": RecallKind.EPISODE,
    "episode": RecallKind.EPISODE,
    "procedures": RecallKind.PROCEDURE,
    "procedure": RecallKind.PROCEDURE,
}
MAX_RECALL_LIMIT = 200
MAX_QUERY_LENGTH = 4000


class NoEmbedder(MemoryServiceError):
    """An operation needs an embedder and recall is keyword-only."""


def _check_types(types):
    if isinstance(types, str):
        types = [t for t in types.split(",") if t.strip()]
    if not isinstance(types, (list, tuple, set, frozenset)) or not types:
        raise InvalidMemoryArgument("types", "must be a non-empty list of facts, episodes, procedures")
    kinds = []
    for name in types:
        kind = RECALL_TYPES.get(str(name).strip().lower()) if isinstance(name, str) else None
        if kind is None:
            raise InvalidMemoryArgument("types", f"unknown type {name!r}; use facts, episodes, procedures")
        if kind not in kinds:
            kinds.append(kind)
    return kinds


class Recall:
    """What a viewer recalls, lists and forgets (see memory/recall/ranking.py for the ranking)."""

    def __init__(self, backend, facts, operators):
        self.backend = backend
        self.facts = facts
        self.operators = operators

    def recall(
        self,
        query,
        *,
        agent_id="",
        user_id=None,
        session_id="",
        types=("facts", "episodes", "procedures"),
        limit=None,
        min_confidence=None,
        mode="auto",
        as_of=None,
        valid_at=None,
        record=True,
    ):
        """The memories most relevant to `query` that this viewer may see, best first.

        Arguments:
            query: free text (a question, the user's message).
            agent_id, user_id, session_id: the viewer, as for get_fact/search_facts. It sees global
                facts, its agent's, its user's (following merges) and its session's facts, a more
                specific fact hiding a less specific one with the same key; episodes of its agent
                with its user, its user's episodes without an agent, its session's episodes without
                either; a viewer without a user also its agent's episodes without a user and episodes
                without any owner (never shown to a person: they may hold anyone's words); shared
                procedures and its agent's, an agent's active procedure hiding the shared one of the
                same name. Inactive procedures are never recalled.
            types: any of "facts", "episodes", "procedures".
            limit: at most this many hits (default MEMORY["RECALL_LIMIT"], at most 200).
            min_confidence: facts below it are left out (a fact it leaves out still hides others).
            mode: "auto" (hybrid with an embedder, else keyword), "hybrid", "keyword" or "vector".
            valid_at, as_of: world time and recorded time, as for get_fact. Facts are found by what
                they say now and shown as they held then (a value closed since shows its old
                value; one that held nothing then is left out); with `as_of`, episodes begun
                after it are left out. Without either, a fact that does not hold now (closed, or
                dated to start later) is shown as what holds now, or left out.
            record: False for a recall the memory makes on its own behalf (observe's look for the
                stored facts a new one may touch): no recall events, no reference or access counts,
                so it neither promotes nor keeps alive what it finds.

        Returns a RecallResult: a list of RecallHit (kind, id, text, score, item, keyword_score,
        vector_score) with `mode` (the mode used) and `embed_ms` (how long the recall waited for the
        query's embedding, which runs alongside its database work).
        Records one RecallEvent per hit and bumps the hits' reference counts, buffered (see
        memory/recall/events.py): a recall never commits. Raises InvalidMemoryArgument for bad
        arguments, MemoryNotFound when `user_id` names no memory user (forgotten, or never there:
        nothing is recalled or logged) and EmbeddingModelChanged when stored vectors are from another model.
        """
        # Free text (a whole message): any number of words, but clean and at most MAX_QUERY_LENGTH.
        query = clean_text("query", query, max_length=MAX_QUERY_LENGTH)
        viewer = make_viewer(agent_id, user_id, session_id)
        kinds = _check_types(types)
        limit = check_limit(limit, memory_settings.RECALL_LIMIT)
        if limit > MAX_RECALL_LIMIT:
            raise InvalidMemoryArgument("limit", f"must be at most {MAX_RECALL_LIMIT}")
        if min_confidence is not None:
            min_confidence = check_unit_interval("min_confidence", min_confidence)
        if mode not in MODES:
            raise InvalidMemoryArgument("mode", f"must be one of {', '.join(MODES)}; got {mode!r}")
        times = self.facts.read_times(as_of=as_of, valid_at=valid_at)
        recaller = Recaller(self.backend, viewer, query, keyword_terms(query), kinds, limit, min_confidence, mode)
        used_mode, hits = recaller.run()
        hits = self._at_times(hits, viewer, times)
        if record:
            now = timezone.now()
            recall_log.record(recall_events(hits, viewer, query, used_mode, now), recaller.doc_ids, now)
            access_counter.record([h.id for h in hits if h.kind == RecallKind.FACT])
        return RecallResult(hits=hits, mode=used_mode, embed_ms=recaller.embed_ms, timings=recaller.timings)

    def _at_times(self, hits, viewer, times):
        """The hits as they held at `times` (None: now): facts swapped for their state then (left out
        when none held), episodes begun after `as_of` left out."""
        now = timezone.now()
        facts = [h for h in hits if h.kind == RecallKind.FACT]
        if times is None:
            facts = [h for h in facts if not holds(h.item, now)]
            if not facts:  # the usual case: every fact found holds now
                return hits
            times = self.facts.read_times(valid_at=now)
        states = self.facts.states_at(viewer, [h.item.key for h in facts], times) if facts else {}
        swapped = {}
        for hit in facts:
            state = states.get((hit.item.scope_key, hit.item.key))
            swapped[hit.id] = None if state is None else replace(hit, item=state, text=item_text(hit.kind, state))
        kept = []
        for hit in hits:
            if hit.kind == RecallKind.FACT and hit.id in swapped:
                hit = swapped[hit.id]
            elif hit.kind == RecallKind.EPISODE and times.as_of is not None and hit.item.started_at > times.as_of:
                hit = None
            if hit is not None:
                kept.append(hit)
        return kept

    def forget_visible(self, kind, item_id, *, agent_id="", user_id=None, session_id="", actor=""):
        """Delete one fact, episode or procedure that this viewer may see (the owners recall shows it).

        For agents' `forget` tools: anything the viewer may not see, or that does not exist (or is
        deleted meanwhile), is refused with the same InvalidMemoryArgument on "id", so a caller learns
        nothing of other people's memories. Visible means what recall shows this viewer: global, the
        agent's own, the user's, and the session's memories. Returns True.
        """
        kind = check_choice("kind", kind, RecallKind)
        item_id = check_int("id", item_id, minimum=1)
        viewer = make_viewer(agent_id, user_id, session_id)
        owners = viewer_owners(self.backend, viewer)
        refused = InvalidMemoryArgument("id", f"there is no {kind} {item_id} among the memories you can see")
        if not RecallDocument.objects.filter(kind=kind, item_id=item_id, owner__in=owners).exists():
            raise refused
        delete = {
            "fact": self.operators.delete_facts,
            "episode": self.operators.delete_episodes,
            "procedure": self.operators.delete_procedures,
        }
        if delete[kind]([item_id], actor=actor).deleted != 1:  # deleted meanwhile by someone else
            raise refused
        return True

    def list_visible(self, kind, *, agent_id="", user_id=None, session_id="", category=None, limit=20):
        """The newest memories of one kind that this viewer may see, as recall would show them.

        For agents' `list_memories` tools. `category`: a fact's type, an episode's trigger type, a
        procedure's name prefix ("<category>/", as agents' `learn_procedure` names them). Facts are
        listed by key with shadowed ones left out (list_facts); episodes newest first; procedures
        active only, newest first.
        """
        kind = check_choice("kind", kind, RecallKind)
        limit = min(check_limit(limit, 20), MAX_RECALL_LIMIT)
        if category is not None:
            category = clean_text("category", category, max_length=50)
        if kind == RecallKind.FACT:
            if category is not None and category not in FactType.values:
                raise InvalidMemoryArgument(
                    "category", f"a fact's category is its type: one of {', '.join(FactType.values)}"
                )
            return self.facts.list_facts(
                agent_id=agent_id, user_id=user_id, session_id=session_id, fact_type=category, limit=limit
            )
        owners = viewer_owners(self.backend, make_viewer(agent_id, user_id, session_id))
        visible = RecallDocument.objects.filter(kind=kind, owner__in=owners, active=True).values("item_id")
        if kind == RecallKind.EPISODE:
            items = Episode.objects.filter(pk__in=visible).order_by("-started_at", "-pk")
            if category is not None:
                items = items.filter(trigger_type=category)
        else:
            items = Procedure.objects.filter(pk__in=visible, is_active=True).order_by("-updated_at", "-pk")
            if category is not None:
                items = items.filter(name__startswith=f"{category}/")
        return list(items[:limit])

    def memory_relations(self, kind, item_id):
        """The memory graph's edges of one fact, episode or procedure (memory/recall/relations.py):
        [(direction "to"/"from", relation, weight, other kind, other id)], strongest first."""
        kind = check_choice("kind", kind, RecallKind)
        return relations_of(kind, check_int("item_id", item_id, minimum=1))

    def recall_mode(self):
        """ "hybrid" when an embedder is configured and installed, else "keyword-only". Loads no model."""
        return configured_mode()


class RecallIndex:
    """The recall index's upkeep: documents embedded after writes commit, reindexing, compacting."""

    def __init__(self, backend):
        self.backend = backend

    def flush_recall_log(self):
        """Write buffered recall events and reference counts now; returns how many events were written."""
        return recall_log.flush()

    def optimize_recall_index(self):
        """Compact the keyword recall index; worth it after a bulk load."""
        self.backend.optimize_recall_index()

    def embed_for_recall(self, kind, item_ids):
        """Have these items' recall documents embedded once the write commits (memory/recall/indexer.py).

        The triggers have already written the document and cleared a stale vector; no model is
        called here, inside the write's transaction (unless MEMORY["EMBED_ON_WRITE"] is "inline").
        """
        indexer.schedule(kind, item_ids)

    def wait_for_vectors(self, timeout=None):
        """Block until every write committed so far has its vector (or its embedding failed).

        The direct path for a caller that wants vector recall to see what it just wrote; recall's
        keyword leg finds pending documents without it. False when `timeout` seconds passed first.
        """
        return indexer.wait(timeout)

    def pending_vectors(self):
        """How many recall documents wait for a vector (0 when recall is keyword-only)."""
        return pending_count() if configured_mode() == "hybrid" else 0

    def reindex_recall(self, *, missing_only=False, batch_size=256, progress=None):
        """Embed recall documents with the configured embedder and record it as the vectors' model.

        `missing_only`: only documents without a vector (after writes that could not embed), and
        only when the recorded model is the configured one. Otherwise every document, one
        transaction per batch; the model record is replaced at the end. `progress(done, total)` is
        called after each batch. Returns how many documents were embedded.
        """
        reset_embedder()
        embedder = get_embedder()
        if embedder is None:
            raise NoEmbedder("no embedder is configured (MEMORY['EMBEDDINGS']): recall is keyword-only")
        record = EmbeddingModelRecord.objects.order_by("pk").first()
        same_model = record is not None and (record.model, record.dimension) == (embedder.model, embedder.dimension)
        if missing_only and record is not None and not same_model:
            raise EmbeddingModelChanged(record.model, record.dimension, embedder.model, embedder.dimension)
        docs = RecallDocument.objects.exclude(text="")
        kept_out = kept_out_of_vectors()
        if kept_out is not None:
            docs = docs.exclude(kept_out)
            if not missing_only:  # vectors of episodes MEMORY["EMBED_EPISODE_KINDS"] no longer lists go
                RecallDocument.objects.filter(kept_out).exclude(embedding=None).update(embedding=None)
        if missing_only:
            docs = docs.filter(embedding__isnull=True)
        ids = list(docs.order_by("id").values_list("id", flat=True))
        total, done = len(ids), 0
        if progress:
            progress(0, total)
        for start in range(0, total, batch_size):
            batch = ids[start : start + batch_size]
            # The model runs outside any transaction; a text changed meanwhile keeps its own turn.
            if missing_only:
                # Through the same claim as every embedding worker: a document another process is
                # embedding is left to it, and a stored vector is never overwritten.
                embed_documents(pending_documents(ids=batch, limit=len(batch)), link=False)
            else:
                rows = list(RecallDocument.objects.filter(id__in=batch).values_list("id", "text"))
                vectors = embedder.pieces([text for _, text in rows])
                with transaction.atomic():
                    for (doc_id, text), vector in zip(rows, vectors):
                        RecallDocument.objects.filter(pk=doc_id, text=text).update(embedding=to_blob(vector))
            done += len(batch)
            if progress:
                progress(done, total)
        with transaction.atomic():
            EmbeddingModelRecord.objects.all().delete()
            EmbeddingModelRecord.objects.create(model=embedder.model, dimension=embedder.dimension)
        model_guard.reset()
        reset_vector_index()
        # The graph's `similar` edges, from the new vectors (a full reindex: every document's anew).
        relink_similar(
            ids if missing_only else list(RecallDocument.objects.values_list("id", flat=True)), embedder.dimension
        )
        link_contradictions()  # and any `contradicts` edge a killed process had not written yet
        return total
