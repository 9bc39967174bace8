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

WAL checkpoints (copying committed pages from the -wal file back into the database file) run on a
background thread per file, not inside a writer's commit; see WalCheckpointer. Cursors remember
each statement's placeholder rewrite; see CursorWrapper.
"""

import logging
import os
import sqlite3
import threading
from collections import defaultdict
from functools import lru_cache
from urllib.parse import quote

from django.db.backends.sqlite3 import base as sqlite3_base
from django.db.utils import OperationalError

logger = logging.getLogger(__name__)

_locks = defaultdict(threading.Lock)
_locks_guard = threading.Lock()
_checkpointers = {}


def write_lock(name):
    """The process-wide write lock of the database file `name`."""
    with _locks_guard:
        return _locks[str(name)]


class WalCheckpointer:
    """Copies a WAL-mode database's committed pages back into its file, on a background thread.

    By default the commit that takes the WAL past 1,000 pages does that copy itself: on a store of
    100,000 facts, one commit in about fifty then took ~10 ms, some 40% of all write time. Here
    commits only append; this thread runs a PASSIVE checkpoint (which never waits for readers or
    writers) after every CHECKPOINT_EVERY commits, or a second after the last commit. Connections
    keep SQLite's automatic checkpoint at BACKSTOP_PAGES, in case the thread falls behind.
    """

    CHECKPOINT_EVERY = 64
    BACKSTOP_PAGES = 10_000

    def __init__(self, path):
        self.path = str(path)
        self.checkpoints = 0
        self.last_result = None  # (busy, frames in the WAL, frames copied back) of the last run
        self._commits = 0
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engram-wal-checkpoint", daemon=True)
        self._thread.start()

    @classmethod
    def for_file(cls, path):
        """The process's checkpointer of a database file, started on first use."""
        key = (os.getpid(), str(path))  # a forked child starts its own thread
        with _locks_guard:
            if key not in _checkpointers:
                _checkpointers[key] = cls(path)
            return _checkpointers[key]

    def committed(self):
        self._commits += 1  # a count lost to a race only delays a checkpoint until the next one
        if self._commits >= self.CHECKPOINT_EVERY:
            self._wake.set()

    def _run(self):
        while True:
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            if self._commits:
                self._commits = 0
                self.checkpoint()

    def checkpoint(self):
        # Its own short-lived connection: mode=rw never creates a file that has gone (a test database).
        try:
            conn = sqlite3.connect(f"file:{quote(self.path)}?mode=rw", uri=True, timeout=0)
        except sqlite3.Error:
            return
        try:
            self.last_result = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.checkpoints += 1
        except sqlite3.Error as exc:  # the file was removed or is not a database any more
            logger.debug("WAL checkpoint of %s skipped: %s", self.path, exc)
        finally:
            conn.close()


_CACHED_QUERY_CHARS = 4000  # bulk statements with thousands of placeholders are not worth keeping


@lru_cache(maxsize=1024)
def _qmark(query):
    return sqlite3_base.FORMAT_QMARK_REGEX.sub("?", query).replace("%%", "%")


class CursorWrapper(sqlite3_base.SQLiteCursorWrapper):
    """Django's cursor, remembering each statement's "%s" to "?" rewrite: the same statements run
    again and again, and the rewrite (a regular expression over the whole text) cost a tenth of a get."""

    def convert_query(self, query, *, param_names=None):
        if param_names is None and len(query) <= _CACHED_QUERY_CHARS:
            return _qmark(query)
        return super().convert_query(query, param_names=param_names)


class DatabaseWrapper(sqlite3_base.DatabaseWrapper):
    _holds_write_lock = False
    checkpointer = None

    def create_cursor(self, name=None):
        if os.environ.get('X_NOQMARK'):
            return self.connection.cursor(factory=sqlite3_base.SQLiteCursorWrapper)
        return self.connection.cursor(factory=CursorWrapper)

    def get_new_connection(self, conn_params):
        conn = super().get_new_connection(conn_params)
        # Deleted and overwritten content is zeroed in the file, not left in free space: forgetting a
        # person must not leave their words readable in db.sqlite3 (memory/erasure.py).
        conn.execute("PRAGMA secure_delete = ON")
        if not os.environ.get('X_NOCKPT') and not self.is_in_memory_db() and conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
            conn.execute(f"PRAGMA wal_autocheckpoint = {WalCheckpointer.BACKSTOP_PAGES}")
            self.checkpointer = WalCheckpointer.for_file(self.settings_dict["NAME"])
        return conn

    def _write_lock(self):
        return write_lock(self.settings_dict["NAME"])

    def _start_transaction_under_autocommit(self):
        if os.environ.get('X_NOLOCK'):
            return super()._start_transaction_under_autocommit()
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
        if self.checkpointer is not None:
            self.checkpointer.committed()
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
