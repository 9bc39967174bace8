"""What the database keeps of deleted rows, and how each backend lets go of it: PostgreSQL's planner
statistics, SQLite's free pages and write-ahead log. The erasure of a person and pruning ask the
backend (scrub_after_erasure, reclaim_space); these are the two databases' answers.
"""

import logging
import time

from django.db import DatabaseError, connection, transaction

from ..conf import memory_settings

logger = logging.getLogger("engram.memory")


def postgresql_scrub(backend, tables):
    """PostgreSQL: new statistics of every table that held the person, so pg_stats lets go of them.

    ANALYZE of a table left empty keeps its old statistics (there is no sample to replace them with),
    so an empty table's are cleared: by deleting its pg_statistic rows where the role may (a superuser),
    else by restating each column's own type, which drops that column's statistics (table owners may;
    no rewrite for the same type, and the table is empty).
    """
    refreshed, problems = [], []
    existing = set(connection.introspection.table_names())
    for table in tables:
        if table not in existing:
            continue
        quoted = connection.ops.quote_name(table)
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"ANALYZE {quoted}")
                cursor.execute(f"SELECT NOT EXISTS (SELECT 1 FROM {quoted})")
                empty = cursor.fetchone()[0]
            if empty:
                _clear_statistics(table)
            refreshed.append(table)
        except DatabaseError as exc:
            logger.exception("erasure: could not refresh the statistics of %s", table)
            problems.append(f"the statistics of {table} were not refreshed: {exc}")
    return refreshed, problems


def _clear_statistics(table):
    quoted = connection.ops.quote_name(table)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod), co.collname FROM pg_stats s "
            "JOIN pg_attribute a ON a.attrelid = %s::regclass AND a.attname = s.attname "
            "LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0 "
            "WHERE s.schemaname = current_schema() AND s.tablename = %s",
            [quoted, table],
        )
        columns = cursor.fetchall()
    if not columns:
        return
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("DELETE FROM pg_statistic WHERE starelid = %s::regclass", [quoted])
        return
    except DatabaseError:  # not a superuser: the owner's way, column by column
        pass
    with transaction.atomic(), connection.cursor() as cursor:
        for column, type_sql, collation in columns:
            collate = f" COLLATE {connection.ops.quote_name(collation)}" if collation else ""
            cursor.execute(
                f"ALTER TABLE {quoted} ALTER COLUMN {connection.ops.quote_name(column)} TYPE {type_sql}{collate}"
            )


def truncate_wal(execute, wait_seconds, what):
    """Truncate a SQLite WAL, retrying while a reader holds older frames, for at most `wait_seconds`.

    `execute(sql)` runs one statement and returns its first row. Returns None when the WAL is empty,
    else why not. Each try waits at most 100 ms for readers (the busy timeout), then tries again.
    """
    (previous,) = execute("PRAGMA busy_timeout")
    execute("PRAGMA busy_timeout = 100")
    deadline = time.monotonic() + max(0.0, float(wait_seconds))
    try:
        while True:
            busy, frames, _copied = execute("PRAGMA wal_checkpoint(TRUNCATE)")
            if not busy:
                return None
            if time.monotonic() >= deadline:
                return (
                    f"a reader kept {what}'s WAL ({frames} frames) from being truncated for {wait_seconds} s: "
                    "the deleted words may still be in its -wal file until the next erasure or checkpoint"
                )
            time.sleep(0.05)
    finally:
        execute(f"PRAGMA busy_timeout = {int(previous)}")


def sqlite_scrub(backend, tables):
    """SQLite: freed pages back to the file system and the WAL truncated (secure_delete has already
    overwritten the deleted content in the pages themselves)."""

    def execute(sql):
        with connection.cursor() as cursor:
            cursor.execute(sql)
            return cursor.fetchone()

    try:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA incremental_vacuum")  # freed pages back to the file system
            cursor.fetchall()
        problem = truncate_wal(execute, memory_settings.ERASURE_WAL_WAIT_SECONDS, "the database")
    except DatabaseError as exc:
        logger.exception("erasure: could not truncate the database's WAL")
        problem = f"the database's WAL could not be truncated: {exc}"
    return [], [problem] if problem else []


def sqlite_reclaim_space(backend):
    """SQLite: return free pages to the file system (incremental vacuum); returns how many were freed.

    Python's sqlite3 steps `execute("PRAGMA incremental_vacuum")` once, which frees one page; its
    `executescript` runs the pragma to the end, but commits any open transaction first. So inside a
    transaction the vacuum waits for the commit (`on_commit`) and this returns None. 0 on PostgreSQL,
    whose autovacuum reclaims dead rows itself.
    """
    if connection.in_atomic_block:
        transaction.on_commit(_incremental_vacuum)
        return None
    return _incremental_vacuum()


def _incremental_vacuum():
    connection.ensure_connection()
    raw = connection.connection
    before = raw.execute("PRAGMA freelist_count").fetchone()[0]
    raw.executescript("PRAGMA incremental_vacuum;")
    return before - raw.execute("PRAGMA freelist_count").fetchone()[0]
