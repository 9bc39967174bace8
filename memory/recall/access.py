"""Buffered access counting: reads note which facts they returned; one UPDATE writes the counts later.

A read never commits. The buffer (memory/buffers.py) is written when it holds ACCESS_FLUSH_PENDING
facts, when a request finishes, at process exit, and on MemoryService.flush_access_counts(). Counts
still in the buffer when a process is killed are lost; they are statistics, not memory.
"""

from collections import Counter

from django.utils import timezone

from ..backends.rows import bump_counters
from ..buffers import WriteBuffer
from ..conf import memory_settings
from ..models import Fact


class _Counts(Counter):
    last = None  # when the latest read was noted: the facts' last_accessed


class AccessCounter(WriteBuffer):
    what = "facts' access counts"

    def empty(self):
        return _Counts()

    def limit(self):
        return memory_settings.ACCESS_FLUSH_PENDING

    def record(self, fact_ids):
        if not fact_ids:
            return
        now = timezone.now()

        def note(counts):
            counts.update(fact_ids)
            counts.last = now

        self.add(note)

    def forget(self, fact_ids):
        """Drop buffered counts of these facts: they are being erased."""
        gone = set(fact_ids)

        def keep(counts):
            kept = _Counts({pk: n for pk, n in counts.items() if pk not in gone})
            kept.last = counts.last
            return kept

        if gone:
            self.discard(keep)

    def write(self, counts):
        return bump_counters(Fact, counts, "access_count", "last_accessed", counts.last)


access_counter = AccessCounter()
