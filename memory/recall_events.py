"""Buffered recall log: each recall notes its hits; one transaction writes events and reference counts later.

A recall never commits. The buffer (memory/buffers.py) is written when it holds RECALL_FLUSH_PENDING
hits, when a request finishes, at process exit, and on MemoryService.flush_recall_log(): RecallEvent
rows in bulk, and per document `reference_count` + n and `last_referenced` in one UPDATE per distinct
count. Hits still in the buffer when a process is killed are lost; they are statistics, not memory.
"""

from collections import Counter

from .backends.rows import bump_counters
from .buffers import WriteBuffer
from .conf import memory_settings
from .models import RecallDocument, RecallEvent

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

    def write(self, hits):
        RecallEvent.objects.bulk_create(hits, batch_size=_CHUNK)
        bump_counters(RecallDocument, hits.references, "reference_count", "last_referenced", hits.last)
        return len(hits)


recall_log = RecallLog()
