"""Django's SQLite backend, with write transactions queued on an in-process lock instead of SQLite's busy handler.

SQLite lets one connection write at a time; with `transaction_mode="IMMEDIATE"` every transaction
takes the write lock at BEGIN. A connection that finds it taken sleeps in SQLite's busy handler
with growing pauses (1, 2, 5, 10 ... 100 ms) and may wake long after the lock was freed: under four
concurrent webhook runs that made one run in twenty wait over 20 ms and a few over half a second.
Here each transaction first takes a lock shared by every connection of this process to the same
file, so a waiting thread is woken the moment the writer before it commits or rolls back. It waits
at most the connection's `timeout` option (as SQLite would) and then fails as SQLite does, with
"database is locked". Writers in other processes still meet SQLite's own lock and busy handler.

Autocommit statements outside `transaction.atomic()` take no lock; writers that may meet others
(buffered counters, thread tracking) run inside atomic blocks.
"""
import threading
from collections import defaultdict

from django.db.backends.sqlite3 import base as sqlite3_base
from django.db.utils import OperationalError

_locks = defaultdict(threading.Lock)
_locks_guard = threading.Lock()


def write_lock(name):
    """The process-wide write lock of the database file `name`."""
    with _locks_guard:
        return _locks[str(name)]


class DatabaseWrapper(sqlite3_base.DatabaseWrapper):
    _holds_write_lock = False

    def _write_lock(self):
        return write_lock(self.settings_dict["NAME"])

    def _start_transaction_under_autocommit(self):
        timeout = self.settings_dict.get("OPTIONS", {}).get("timeout", 5)
        if not self._write_lock().acquire(timeout=timeout):
            raise OperationalError("database is locked (another thread of this process held the write lock)")
        self._holds_write_lock = True
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            self._release_write_lock()
            raise

    def _release_write_lock(self):
        if self._holds_write_lock:
            self._holds_write_lock = False
            self._write_lock().release()

    def _commit(self):
        # A failed COMMIT leaves the transaction open; the rollback (or close) that follows releases.
        result = super()._commit()
        self._release_write_lock()
        return result

    def _rollback(self):
        try:
            return super()._rollback()
        finally:
            self._release_write_lock()

    def _close(self):
        try:
            return super()._close()
        finally:
            self._release_write_lock()
