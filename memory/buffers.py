"""Write buffers: what reads and committed writes note, written later in one transaction.

A read never commits, and a bulk writer should not pay a transaction (on PostgreSQL a WAL flush)
per statistic. So access counts (memory/domain/access.py), recall events (memory/recall/events.py) and
`contradicts` edges (memory/recall/relations.py) are noted in a process-wide buffer and written when the
buffer holds its limit, when a request finishes (memory/signals.py: every buffer in one transaction),
at process exit, and on flush(). What a killed process had noted is lost, so only statistics or what
can be rebuilt are buffered.
"""

import atexit
import logging
import threading

from django.db import DatabaseError, transaction

logger = logging.getLogger("engram.memory")

BUFFERS = []


class WriteBuffer:
    """One buffer. Subclasses say what an empty buffer is (any container: len() is its size), the
    size that triggers a flush, and how a taken buffer is written (inside a transaction)."""

    what = "buffered notes"  # for the log

    def __init__(self):
        self._lock = threading.Lock()
        self._pending = self.empty()
        BUFFERS.append(self)
        atexit.register(self._flush_at_exit)

    def empty(self):
        raise NotImplementedError

    def limit(self):
        raise NotImplementedError

    def write(self, pending):
        """Write a taken buffer; returns how many rows it wrote."""
        raise NotImplementedError

    @property
    def pending(self):
        return len(self._pending)

    def add(self, note):
        """Apply `note(pending)` under the lock; flush when the buffer is full."""
        with self._lock:
            note(self._pending)
            full = len(self._pending) >= self.limit()
        if full:
            self.flush()

    def discard(self, keep):
        """Keep only what `keep(pending)` returns (a new container): what is being erased goes."""
        with self._lock:
            self._pending = keep(self._pending)

    def flush(self):
        """Write the buffer; returns how many rows were written. A database error is logged, not
        raised: what was noted is a statistic or can be rebuilt, and the caller's work is done."""
        with self._lock:
            pending, self._pending = self._pending, self.empty()
        if not pending:
            return 0
        try:
            with transaction.atomic():  # one write transaction; a savepoint inside a request's flush
                return self.write(pending)
        except DatabaseError:
            logger.exception("could not write %d %s", len(pending), self.what)
            return 0

    def _flush_at_exit(self):
        try:
            self.flush()
        except Exception:  # the interpreter is going away; nothing better to do than say so
            logger.exception("could not write %s at exit", self.what)


def any_pending():
    return any(buffer.pending for buffer in BUFFERS)


def flush_all():
    """Write every buffer, in one transaction when called outside one."""
    if not any_pending():
        return
    with transaction.atomic():
        for buffer in BUFFERS:
            buffer.flush()
