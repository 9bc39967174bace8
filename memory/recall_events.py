"""Buffered recall log: each recall notes its hits; one transaction writes events and reference counts later.

A recall never commits. The buffer is written when it holds RECALL_FLUSH_PENDING hits, when a request
finishes, at process exit, and on MemoryService.flush_recall_log(): RecallEvent rows in bulk, and
per document `reference_count` + n and `last_referenced` in one UPDATE per distinct count. Hits still
in the buffer when a process is killed are lost; they are statistics, not memory.
"""

import atexit
import logging
import threading
from collections import Counter

from django.db import DatabaseError, transaction

from .backends.rows import bump_counters
from .conf import memory_settings
from .models import RecallDocument, RecallEvent

logger = logging.getLogger("engram.memory")

_CHUNK = 2000


class RecallLog:
    def __init__(self):
        self._lock = threading.Lock()
        self._events = []
        self._references = Counter()
        self._last = None

    @property
    def pending(self):
        return len(self._events)

    def record(self, events, doc_ids, when):
        """Note one recall's hits: RecallEvent objects (unsaved) and the documents they came from."""
        if not events:
            return
        with self._lock:
            self._events.extend(events)
            self._references.update(doc_ids)
            self._last = when
            full = len(self._events) >= memory_settings.RECALL_FLUSH_PENDING
        if full:
            self.flush()

    def forget(self, user_ids, items):
        """Drop buffered events of these users, or of these items ({kind: ids}): they are being erased."""
        user_ids = set(user_ids)
        wanted = {(kind, i) for kind, ids in items.items() for i in ids}
        with self._lock:
            self._events = [e for e in self._events if e.user_id not in user_ids and (e.kind, e.item_id) not in wanted]

    def flush(self):
        """Write buffered events and reference counts; returns how many events were written."""
        with self._lock:
            events, references, when = self._events, self._references, self._last
            self._events, self._references, self._last = [], Counter(), None
        if not events:
            return 0
        try:
            with transaction.atomic():
                RecallEvent.objects.bulk_create(events, batch_size=_CHUNK)
                bump_counters(RecallDocument, references, "reference_count", "last_referenced", when)
        except DatabaseError:
            logger.exception("could not write %d recall events", len(events))
            return 0
        return len(events)


recall_log = RecallLog()


def _flush_at_exit():
    try:
        recall_log.flush()
    except Exception:  # the interpreter is going away; nothing better to do than say so
        logger.exception("could not write recall events at exit")


atexit.register(_flush_at_exit)
