"""Buffered access counting: reads note which facts they returned; one UPDATE writes the counts later.

A read never commits. The buffer is written when it holds ACCESS_FLUSH_PENDING facts, when a
request finishes, at process exit, and on MemoryService.flush_access_counts(). Counts still in the
buffer when a process is killed are lost; they are statistics, not memory.
"""

import atexit
import logging
import threading
from collections import Counter

from django.db import DatabaseError, transaction
from django.utils import timezone

from .backends.rows import bump_counters
from .conf import memory_settings
from .models import Fact

logger = logging.getLogger("engram.memory")


class AccessCounter:
    def __init__(self):
        self._lock = threading.Lock()
        self._pending = Counter()
        self._last = None

    @property
    def pending(self):
        return len(self._pending)

    def record(self, fact_ids):
        if not fact_ids:
            return
        with self._lock:
            self._pending.update(fact_ids)
            self._last = timezone.now()
            full = len(self._pending) >= memory_settings.ACCESS_FLUSH_PENDING
        if full:
            self.flush()

    def flush(self):
        """Write the buffered counts; returns how many facts were updated."""
        with self._lock:
            pending, when = self._pending, self._last
            self._pending, self._last = Counter(), None
        if not pending:
            return 0
        updated = 0
        try:
            with transaction.atomic():  # one write transaction (queued with the others on SQLite)
                updated = bump_counters(Fact, pending, "access_count", "last_accessed", when)
        except DatabaseError:
            logger.exception("could not write access counts for %d facts", len(pending))
        return updated


access_counter = AccessCounter()


def _flush_at_exit():
    try:
        access_counter.flush()
    except Exception:  # the interpreter is going away; nothing better to do than say so
        logger.exception("could not write access counts at exit")


atexit.register(_flush_at_exit)
