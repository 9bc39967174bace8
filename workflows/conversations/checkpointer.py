"""The shared LangGraph checkpointer: one lazily created, thread-safe saver per process.

SQLite (`SqliteSaver`, a file at WORKFLOWS["CHECKPOINT_PATH"]) unless the Django database is
PostgreSQL, then `PostgresSaver` on the same database through a small connection pool. The savers
serialise their own calls with a lock; use them only through `BaseCheckpointSaver` methods.

Every checkpoint write of a person's thread (an Engram thread id, `<memory user id>:...`) checks,
before and after, that the person was not forgotten, on any server (`unless_forgotten`): after a
forget commits nothing more is written for them, and a write that raced the commit deletes its
thread itself. The forget deletes every thread under the person's id prefix once it commits,
tracked or not (`person_thread_ids`), so checkpoints written before it go too.
"""

import logging
import re
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, connections

from ..conf import on_workflow_settings_changed, workflow_settings

logger = logging.getLogger("engram.workflows")

_lock = threading.Lock()
_saver = None
_closer = None


def checkpoint_path():
    """The SQLite checkpoint file: WORKFLOWS["CHECKPOINT_PATH"], else data/checkpoints.db under the
    project's BASE_DIR (the folder of manage.py in a `django-admin startproject` site)."""
    path = workflow_settings.CHECKPOINT_PATH
    if path:
        return Path(path)
    base = getattr(settings, "BASE_DIR", None)
    if base is None:
        raise ImproperlyConfigured(
            "Set WORKFLOWS['CHECKPOINT_PATH'] (the SQLite checkpoint file): the settings define no BASE_DIR "
            "to put data/checkpoints.db under."
        )
    return Path(base) / "data" / "checkpoints.db"


def checkpointer_kind():
    kind = workflow_settings.CHECKPOINTER
    if kind is None:
        kind = "postgres" if connections["default"].vendor == "postgresql" else "sqlite"
    if kind not in {"sqlite", "postgres"}:
        raise ValueError(f"WORKFLOWS['CHECKPOINTER'] must be 'sqlite' or 'postgres', got {kind!r}")
    return kind


def get_checkpointer():
    """The process's shared saver, created on first use."""
    global _saver, _closer
    if _saver is not None:
        return _saver
    with _lock:
        if _saver is None:
            if checkpointer_kind() == "postgres":
                _saver, _closer = _postgres_saver()
            else:
                _saver, _closer = _sqlite_saver()
    return _saver


_PERSON_THREAD = re.compile(r"(\d{1,18}):[^:]+:.")


def thread_owner(config):
    """The memory user id an Engram thread id starts with (`<user>:<conversation>:<workflow>`), else None."""
    match = _PERSON_THREAD.match(str(((config or {}).get("configurable") or {}).get("thread_id") or ""))
    return int(match.group(1)) if match else None


@contextmanager
def unless_forgotten(saver, config):
    """Run a checkpoint write of a person's thread unless the person was forgotten (PersonForgotten).

    Checked before the write (after a forget commits, nothing is written) and again after it: a forget
    that committed while the write ran may have deleted the person's threads before this one landed,
    so the thread is deleted here and the write refused. The forget's tombstone is what is read
    (MemoryService.was_forgotten, as SQL on the saver's own connection): committed with the forget,
    seen from any connection.
    """
    from memory.exceptions import PersonForgotten

    user_id = thread_owner(config)
    if user_id is None:
        yield
        return
    if saver.was_forgotten(user_id):
        raise PersonForgotten(user_id)
    yield
    if saver.was_forgotten(user_id):
        _forget_late_thread(saver, config["configurable"]["thread_id"], user_id)
        raise PersonForgotten(user_id)


def _forget_late_thread(saver, thread_id, user_id):
    from memory.operations.erasure import scrub_after_commit

    saver.delete_thread(thread_id)
    opened = connection.connection is None and not connection.in_atomic_block
    try:
        scrub_after_commit([user_id])  # the forget's own scrub may have come before this write
    finally:
        if opened:  # LangGraph's own short-lived thread: not left open to the thread's end
            connection.close()


class _PersonGuard:
    """Checkpoint writes refused for a forgotten person (see the module's docstring).

    The check runs on the saver's own connection: LangGraph writes checkpoints from short-lived
    threads of its own, where a Django connection would be opened (and set up) for every write.
    PostgreSQL: a connection of the saver's pool, on the memory's database. SQLite: a plain connection
    to the memory's database file (`memory_conn`), read only; without one (checkpoints in SQLite beside
    a PostgreSQL memory) Django's connection is used.
    """

    memory_conn = None
    _memory_lock = threading.Lock()

    def was_forgotten(self, user_id):
        from memory.service import MemoryService

        if isinstance(self.conn, sqlite3.Connection):
            if self.memory_conn is None:
                return self._was_forgotten_by_django(user_id)
            sql = MemoryService().forgotten_sql("?")
            # Every row read: a statement left open would keep a read of the memory's file (and its WAL).
            with self._memory_lock:
                return bool(self.memory_conn.execute(sql, (user_id, user_id)).fetchall())
        with self.conn.connection() as conn:
            return conn.execute(MemoryService().forgotten_sql(), (user_id, user_id)).fetchone() is not None

    def _was_forgotten_by_django(self, user_id):
        from memory.service import MemoryService

        opened = connection.connection is None and not connection.in_atomic_block
        try:
            return MemoryService().was_forgotten(user_id)
        finally:
            if opened:
                connection.close()

    def put(self, config, checkpoint, metadata, new_versions):
        with unless_forgotten(self, config):
            return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config, writes, task_id, task_path=""):
        with unless_forgotten(self, config):
            return super().put_writes(config, writes, task_id, task_path)


def _guarded(saver_class):
    return type(saver_class.__name__, (_PersonGuard, saver_class), {})


def person_thread_ids(user_ids):
    """The ids of every checkpoint thread of these memory users (by the id prefix), tracked or not."""
    saver = get_checkpointer()
    prefixes = [f"{int(u)}:%" for u in user_ids]
    if not prefixes:
        return set()
    where = " OR ".join(["thread_id LIKE %s"] * len(prefixes))
    sql = f"SELECT DISTINCT thread_id FROM checkpoints WHERE {where}"
    if checkpointer_kind() == "sqlite":
        with saver.lock:
            rows = saver.conn.execute(sql.replace("%s", "?"), prefixes).fetchall()
        return {row[0] for row in rows}
    with saver.conn.connection() as conn:
        return {row["thread_id"] for row in conn.execute(sql, prefixes).fetchall()}


def _sqlite_saver():
    from langgraph.checkpoint.sqlite import SqliteSaver

    SqliteSaver = _guarded(SqliteSaver)  # noqa: N806  (the saver, guarded)

    path = checkpoint_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    # The saver serialises access with its own lock, so one connection may serve every thread.
    conn = sqlite3.connect(str(path), check_same_thread=False, timeout=30)
    # WAL (the saver's own setup sets it too) with NORMAL sync: durable at checkpoints of the WAL,
    # not fsynced on every commit; the same trade Django's SQLite settings make for the memory.
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    # Deleted checkpoints (a forgotten person's messages) are overwritten in the file, not just unlinked.
    conn.execute("PRAGMA secure_delete=ON")
    saver = SqliteSaver(conn)
    saver.setup()
    memory = connections["default"]
    if memory.vendor == "sqlite" and not memory.is_in_memory_db():
        # The forgotten-person check of every checkpoint write (_PersonGuard) reads the memory's file on
        # a plain connection of its own (a Django connection's setup costs more than the write).
        saver.memory_conn = sqlite3.connect(str(memory.settings_dict["NAME"]), check_same_thread=False, timeout=30)
        saver.memory_conn.execute("PRAGMA query_only = ON")

        def close():
            saver.memory_conn.close()
            conn.close()

        return saver, close
    return saver, conn.close


CONNECTION_WAIT_S = 5
SETUP_LOCK_KEY = int.from_bytes(b"ckpsetup", "big")  # a PostgreSQL advisory lock key of its own (a bigint)
SETUP_WAIT_S = 60


def _postgres_saver():
    from langgraph.checkpoint.postgres import PostgresSaver

    PostgresSaver = _guarded(PostgresSaver)  # noqa: N806  (the saver, guarded)
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    db = connections["default"].settings_dict
    conninfo = {
        "dbname": db["NAME"],
        "user": db.get("USER") or None,
        "password": db.get("PASSWORD") or None,
        "host": db.get("HOST") or None,
        "port": str(db["PORT"]) if db.get("PORT") else None,
    }
    pool = ConnectionPool(
        kwargs={
            **{k: v for k, v in conninfo.items() if v},
            "autocommit": True,
            "prepare_threshold": 0,
            "row_factory": dict_row,
        },
        min_size=1,
        max_size=4,
        # A checkpoint read or write that gets no connection within this many seconds fails (and
        # /healthz says "unreachable") instead of holding its request for the pool's default 30 s
        # while the database is down; with the database up a connection is free in milliseconds.
        timeout=CONNECTION_WAIT_S,
        open=True,
    )
    saver = PostgresSaver(pool)
    with _setup_lock(pool):
        saver.setup()
    return saver, pool.close


@contextmanager
def _setup_lock(pool):
    """One process at a time sets the PostgreSQL saver up; the others then find its tables there.

    Every server process sets the saver up on its first run, and on a fresh database those runs
    come at once: the saver's CREATE TABLE IF NOT EXISTS and migration rows collided ("duplicate
    key value violates unique constraint"), and the turn went without its conversation. The waiters
    poll for the lock between statements instead of blocking in one: the saver's migrations build
    indexes CONCURRENTLY, which wait for every running statement to end, a blocked waiter's too.
    """
    deadline = time.monotonic() + SETUP_WAIT_S
    with pool.connection() as conn:
        while not conn.execute("SELECT pg_try_advisory_lock(%s) AS taken", (SETUP_LOCK_KEY,)).fetchone()["taken"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"another process kept the checkpointer's setup lock for {SETUP_WAIT_S} s")
            time.sleep(0.05)
        try:
            yield
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (SETUP_LOCK_KEY,))


def scrub_sqlite_files():
    """SQLite checkpoints: write the WAL back and truncate it, so deleted checkpoints leave the disk.

    Retried while a reader holds older frames, for at most MEMORY["ERASURE_WAL_WAIT_SECONDS"] (the
    saver's lock is taken per try, so its own runs go on meanwhile). Returns None, or why the WAL stays.
    """
    from memory.conf import memory_settings
    from memory.operations.erasure import truncate_wal

    saver = _saver
    if saver is None or checkpointer_kind() != "sqlite":
        return None

    def execute(sql):
        with saver.lock:  # the saver's own lock: one statement at a time on its connection
            return saver.conn.execute(sql).fetchone()

    try:
        problem = truncate_wal(execute, memory_settings.ERASURE_WAL_WAIT_SECONDS, "the checkpoint store")
    except sqlite3.Error as exc:
        logger.exception("checkpoints: could not truncate the WAL after an erasure")
        return f"the checkpoint store's WAL could not be truncated: {exc}"
    if problem:
        logger.warning("checkpoints: %s", problem)
    return problem


def keep_newest_checkpoints(thread_id, checkpoint_ids):
    """Delete a thread's root checkpoints other than `checkpoint_ids` (its newest), in ONE transaction.

    LangGraph's savers offer no way to delete single checkpoints through their interface (SqliteSaver
    has no `prune`; PostgresSaver's keeps only the latest). Deleting the thread and putting its newest
    checkpoints back lost the conversation when the process died in between, so this is the one place
    that writes the saver's own tables, on the saver's own connection: the older checkpoints and their
    pending writes (and, on PostgreSQL, the channel blobs no kept checkpoint refers to) go together,
    or nothing does. The oldest kept checkpoint loses its deleted parent. The tests run it against
    the real savers, so a schema change in a saver release fails them, not a user's conversation.
    """
    saver = get_checkpointer()
    keep = list(checkpoint_ids)
    if not keep:
        raise ValueError("keep at least one checkpoint")
    marks = ", ".join(["%s"] * len(keep))
    statements = [
        f"DELETE FROM {{writes}} WHERE thread_id = %s AND checkpoint_ns = '' AND checkpoint_id NOT IN ({marks})",
        f"DELETE FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '' AND checkpoint_id NOT IN ({marks})",
        "UPDATE checkpoints SET parent_checkpoint_id = NULL WHERE thread_id = %s AND checkpoint_ns = '' "
        "AND parent_checkpoint_id IS NOT NULL AND parent_checkpoint_id NOT IN "
        "(SELECT checkpoint_id FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '')",
    ]
    params = [[thread_id, *keep], [thread_id, *keep], [thread_id, thread_id]]
    if checkpointer_kind() == "sqlite":
        with saver.lock:
            conn = saver.conn
            with conn:  # one transaction: committed on success, rolled back on any error
                for sql, args in zip(statements, params):
                    conn.execute(sql.format(writes="writes").replace("%s", "?"), args)
        return
    blobs = (
        "DELETE FROM checkpoint_blobs b WHERE b.thread_id = %s AND b.checkpoint_ns = '' AND NOT EXISTS ("
        "SELECT 1 FROM checkpoints c WHERE c.thread_id = b.thread_id AND c.checkpoint_ns = b.checkpoint_ns "
        "AND c.checkpoint -> 'channel_versions' ->> b.channel = b.version)"
    )
    with saver.conn.connection() as conn, conn.transaction():
        for sql, args in zip([*statements, blobs], [*params, [thread_id]]):
            conn.execute(sql.format(writes="checkpoint_writes"), args)


def existing_checkpointer():
    """The shared saver if one was created, else None (never creates one)."""
    return _saver


def close_checkpointer():
    """Close the shared saver's connection; the next use opens a new one (settings may have changed)."""
    global _saver, _closer
    with _lock:
        closer, _saver, _closer = _closer, None, None
    if closer is not None:
        closer()


on_workflow_settings_changed(close_checkpointer)
