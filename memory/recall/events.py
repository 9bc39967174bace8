"""Buffered recall log: each recall notes its hits; one transaction writes events and reference counts later.

A recall never commits. The buffer (memory/buffers.py) is written when it holds RECALL_FLUSH_PENDING
hits, when a request finishes, at process exit, and on MemoryService.flush_recall_log(): RecallEvent
rows in bulk, and per document `reference_count` + n and `last_referenced` in one UPDATE per distinct
count. Hits still in the buffer when a process is killed are lost; they are statistics, not memory.
"""

import logging
from collections import Counter

from ..backends import get_backend
from ..backends.rows import bump_counters
from ..buffers import WriteBuffer
from ..conf import memory_settings
from ..models import RecallDocument, RecallEvent

logger = logging.getLogger("engram.memory")

_CHUNK = 2000


class _Hits(list):
    """RecallEvent objects (unsaved); `references`: how often each document was a hit."""

    last = None

    def __init__(self, events=(), references=None):
        super().__init__(events)
        self.references = references if references is not None else Counter()


class RecallLog(WriteBuffer):
    what = "recall events"

    def empty(self):
        return _Hits()

    def limit(self):
        return memory_settings.RECALL_FLUSH_PENDING

    def record(self, events, doc_ids, when):
        """Note one recall's hits: RecallEvent objects (unsaved) and the documents they came from."""
        if not events:
            return

        def note(hits):
            hits.extend(events)
            hits.references.update(doc_ids)
            hits.last = when

        self.add(note)

    def forget(self, user_ids, items):
        """Drop buffered events of these users, or of these items ({kind: ids}): they are being erased."""
        user_ids = set(user_ids)
        wanted = {(kind, i) for kind, ids in items.items() for i in ids}

        def keep(hits):
            kept = _Hits(
                (e for e in hits if e.user_id not in user_ids and (e.kind, e.item_id) not in wanted), hits.references
            )
            kept.last = hits.last
            return kept

        self.discard(keep)

    def forget_queries(self, needles):
        """Drop buffered events whose query names one of these strings (case-insensitive)."""
        needles = [n.lower() for n in needles if n]

        def keep(hits):
            kept = _Hits((e for e in hits if not any(n in e.query.lower() for n in needles)), hits.references)
            kept.last = hits.last
            return kept

        if needles:
            self.discard(keep)

    def write(self, hits):
        # Under the person lock: events of someone forgotten meanwhile (by another process, whose
        # forget could not drop this buffer) are dropped, never written under a deleted id.
        people = {e.user_id for e in hits if e.user_id is not None}
        alive = get_backend().hold_people(people) if people else set()
        if people - alive:
            kept = _Hits((e for e in hits if e.user_id is None or e.user_id in alive), hits.references)
            logger.warning("dropped %d recall event(s) of forgotten people", len(hits) - len(kept))
            kept.last, hits = hits.last, kept
        RecallEvent.objects.bulk_create(hits, batch_size=_CHUNK)
        bump_counters(RecallDocument, hits.references, "reference_count", "last_referenced", hits.last)
        return len(hits)


recall_log = RecallLog()
