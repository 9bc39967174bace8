"""One database writer at a time per process on SQLite, queued on a lock instead of SQLite's busy handler.

SQLite lets one connection write at a time. A thread that finds the write lock taken sleeps in
SQLite's busy handler with growing pauses (1, 2, 5, 10 ... 100 ms) and may wake long after the lock
was freed: under four concurrent webhook runs that made one in twenty wait over 20 ms, a few over
half a second. The workflow nodes' write transactions (and the webhook's update_id record) take this
lock first, so waiting threads are woken as soon as the writer before them is done. Other writers
still work as before (SQLite's own lock and timeout remain); on PostgreSQL this is a no-op.
"""
import threading
from contextlib import contextmanager

from django.db import connection

_lock = threading.RLock()


@contextmanager
def serialized_writes():
    if connection.vendor != "sqlite":
        yield
        return
    with _lock:
        yield
