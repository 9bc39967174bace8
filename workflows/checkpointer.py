"""The shared LangGraph checkpointer: one lazily created, thread-safe saver per process.

SQLite (`SqliteSaver`, a file at WORKFLOWS["CHECKPOINT_PATH"]) unless the Django database is
PostgreSQL, then `PostgresSaver` on the same database through a small connection pool. The savers
serialise their own calls with a lock; use them only through `BaseCheckpointSaver` methods.
"""
import logging
import sqlite3
import threading
from pathlib import Path

from django.conf import settings
from django.db import connections

from .conf import workflow_settings

logger = logging.getLogger("engram.workflows")

_lock = threading.Lock()
_saver = None
_closer = None


def checkpoint_path():
    path = workflow_settings.CHECKPOINT_PATH
    if path:
        return Path(path)
    return Path(getattr(settings, "DATA_DIR", Path(settings.BASE_DIR) / "data")) / "checkpoints.db"


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


def _sqlite_saver():
    from langgraph.checkpoint.sqlite import SqliteSaver

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
    return saver, conn.close


def _postgres_saver():
    from langgraph.checkpoint.postgres import PostgresSaver
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
        kwargs={**{k: v for k, v in conninfo.items() if v}, "autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        min_size=1,
        max_size=4,
        open=True,
    )
    saver = PostgresSaver(pool)
    saver.setup()
    return saver, pool.close


def scrub_sqlite_files():
    """SQLite checkpoints: write the WAL back and truncate it, so deleted checkpoints leave the disk."""
    saver = _saver
    if saver is None or checkpointer_kind() != "sqlite":
        return
    try:
        with saver.lock:  # the saver's own lock: one statement at a time on its connection
            saver.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.Error:
        logger.exception("checkpoints: could not truncate the WAL after an erasure")


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
