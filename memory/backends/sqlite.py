"""SQLite backend: an owner-aware FTS5 trigram index serves substring search; JSON1 matches procedures.

Search plans, chosen per query from the index's own term statistics:
- a selective word: one MATCH for that word AND the viewer's owner markers, then exact filters;
- only broad words, best-first with a limit: walk each owner's facts by confidence, stopping at the limit;
- otherwise: the viewer's owners through the (scope_key, key) index.
"""

import contextlib
import hashlib
import json
import threading
import time
from functools import lru_cache

from django.db import connection, transaction
from django.db.backends.signals import connection_created

from ..models.workspaces import current_workspace_id
from .base import (
    FACT_TABLE,
    TEAMS_SQL,
    TRIGRAM,
    USER_OWNER_SQL,
    WALK_OWNERS,
    MemoryBackend,
    escape_like,
    indexable_words,
    owner_keys,
    owners_sql,
    selective_word,
)
from .recall_index import DOC_TABLE
from .space import sqlite_reclaim_space, sqlite_scrub
from .store_rows import SQLiteStoreReads, sqlite_equality_is_exact, sqlite_field_equals

_PUA_START, _PUA_SIZE = 0xE000, 6400  # Unicode private use area: never produced by normal text
_STATS_TTL_S = 300.0  # term statistics only steer the plan, never what matches
_STATS_MAX = 100_000
_TERM_LOOKUP = "SELECT term, doc FROM temp.memory_fact_fts_vocab WHERE term = %s"
_BRANCHES = 400


class IndexDelta:
    """An FTS5 index's delta (migrations 0007 and 0008): rows whose current text the index lacks,
    and index entries to remove. FTS5 writes a segment per changing transaction; the delta lets one
    segment take many changes. A trigger moves it in every 256 rows; `flush` does so now."""

    def __init__(self, index, pending, stale, *, row, text, owner, source):
        self.index, self.pending, self.stale = index, pending, stale
        self.flush_trigger = f"{index}_flush"
        # An entry is removed before the row's new text goes in. CROSS JOIN: SQLite has no
        # statistics for the delta and could otherwise scan every source row to probe it.
        self.statements = (
            f"INSERT INTO {index} ({index}, rowid, {text}, owner) "
            f"SELECT 'delete', {row}, {text}, owner FROM {stale} ORDER BY id",
            f"DELETE FROM {stale}",
            f"INSERT INTO {index} (rowid, {text}, owner) SELECT s.id, s.{text}, engram_owner_marker(s.{owner}) "
            f"FROM {pending} p CROSS JOIN {source} s ON s.id = p.{row}",
            f"DELETE FROM {pending}",
        )

    def flush(self, cursor):
        """Move the delta into the index; inside a transaction, or a writer could slip in between."""
        for sql in self.statements:
            cursor.execute(sql)


FACT_DELTA = IndexDelta(
    "memory_fact_fts",
    "memory_fact_fts_pending",
    "memory_fact_fts_stale",
    row="fact_id",
    text="search_text",
    owner="scope_key",
    source=FACT_TABLE,
)
RECALL_DELTA = IndexDelta(
    "memory_recall_fts",
    "memory_recall_fts_pending",
    "memory_recall_fts_stale",
    row="doc_id",
    text="text",
    owner="owner",
    source=DOC_TABLE,
)


_RECALL_JOIN_SHARE = 0.3  # the viewer owns at least this share of recall documents: join plan


class RecallStatistics:
    """How many recall documents each owner holds (from fts5vocab), and about how many there are; cached briefly."""

    def __init__(self):
        self._lock = threading.Lock()
        self._owners = {}
        self._total = (0, -_STATS_TTL_S * 2)

    def share(self, owners):
        now = time.monotonic()
        markers = {o: owner_marker(o) for o in owners}
        with self._lock:
            missing = [
                m for m in markers.values() if self._owners.get(m, (0, -_STATS_TTL_S * 2))[1] < now - _STATS_TTL_S
            ]
            stale_total = self._total[1] < now - _STATS_TTL_S
        found = {}
        with connection.cursor() as cursor:
            for marker in missing:
                cursor.execute("SELECT doc FROM temp.memory_recall_fts_vocab WHERE term = %s", [marker])
                row = cursor.fetchone()
                found[marker] = (row[0] if row else 0, now)
            if stale_total:
                cursor.execute("SELECT max(id) FROM memory_recall_doc")  # an upper bound; deletions only lower it
                total = (cursor.fetchone()[0] or 0, now)
        with self._lock:
            if len(self._owners) + len(found) > _STATS_MAX:
                self._owners.clear()
            self._owners.update(found)
            if stale_total:
                self._total = total
            owned = sum(self._owners.get(m, (0, 0))[0] for m in markers.values())
            return owned / self._total[0] if self._total[0] else 1.0


def prepare_recall_connection(sender, connection, **kwargs):
    """The recall index's term statistics, per connection (like the fact index's)."""
    if connection.vendor == "sqlite":
        connection.connection.execute(
            "CREATE VIRTUAL TABLE IF NOT EXISTS temp.memory_recall_fts_vocab USING fts5vocab(main, memory_recall_fts, row)"
        )


@lru_cache(maxsize=8192)  # the index triggers ask for it on every write, searches on every query
def owner_marker(scope_key):
    """Three private-use characters standing for an owner: one trigram, so one FTS5 doclist."""
    h = int.from_bytes(hashlib.blake2b(scope_key.encode(), digest_size=8).digest(), "big")
    return "".join(chr(_PUA_START + (h >> (13 * i)) % _PUA_SIZE) for i in range(3))


def prepare_connection(sender, connection, **kwargs):
    """Every SQLite connection needs engram_owner_marker() (the index triggers call it) and a
    per-connection view of the index's term statistics."""
    if connection.vendor == "sqlite":
        connection.connection.create_function("engram_owner_marker", 1, owner_marker, deterministic=True)
        connection.connection.execute(
            "CREATE VIRTUAL TABLE IF NOT EXISTS temp.memory_fact_fts_vocab USING fts5vocab(main, memory_fact_fts, row)"
        )


connection_created.connect(prepare_connection, dispatch_uid="memory_sqlite_functions")
connection_created.connect(prepare_recall_connection, dispatch_uid="memory_sqlite_recall_statistics")


def _phrase(token):
    return '"' + token.replace('"', '""') + '"'


class TermStatistics:
    """How many facts hold a trigram, read from fts5vocab and cached briefly."""

    def __init__(self):
        self._lock = threading.Lock()
        self._rows = {}

    def rows(self, grams):
        """Facts per trigram, looking up the ones not seen lately in one statement."""
        now = time.monotonic()
        found = {}
        missing = [g for g in grams if self._rows.get(g, (0, -_STATS_TTL_S * 2))[1] < now - _STATS_TTL_S]
        if missing:
            found = {g: (0, now) for g in missing}
            with connection.cursor() as cursor:
                # Each branch is an indexed term lookup (an IN list would scan the vocabulary);
                # SQLite allows 500 branches in one compound SELECT.
                for start in range(0, len(missing), _BRANCHES):
                    chunk = missing[start : start + _BRANCHES]
                    cursor.execute(" UNION ALL ".join([_TERM_LOOKUP] * len(chunk)), chunk)
                    for term, doc in cursor.fetchall():
                        found[term] = (doc, now)
            with self._lock:
                if len(self._rows) + len(found) > _STATS_MAX:
                    self._rows.clear()
                self._rows.update(found)
        with self._lock:
            return {g: found.get(g, self._rows.get(g, (0, 0)))[0] for g in grams}

    def token_rows(self, tokens):
        """For each token, at most how many facts contain it: the count of its rarest trigram."""
        grams = {t: {t[i : i + TRIGRAM] for i in range(len(t) - TRIGRAM + 1)} for t in tokens}
        counts = self.rows(set().union(*grams.values()))
        return {t: min(counts[g] for g in gs) for t, gs in grams.items()}


class SQLiteBackend(SQLiteStoreReads, MemoryBackend):
    vendor = "sqlite"
    # A SQLite transaction reads one snapshot already (begin_snapshot: the base's no-op).
    scrub_after_erasure = sqlite_scrub
    reclaim_space = sqlite_reclaim_space
    like_escape = " ESCAPE '\\'"
    # The planner would also take the unique (scope_key, key) index and sort the owner's facts.
    owner_walk_hint = " INDEXED BY fact_owner_confidence"
    store_field_equals = sqlite_field_equals
    store_equality_is_exact = sqlite_equality_is_exact

    def __init__(self):
        self.stats = TermStatistics()
        self.recall_stats = RecallStatistics()

    def optimize(self):
        # Every write transaction adds an FTS5 segment and queries visit each one; after a bulk
        # load, catch up with the delta and merge the segments into one (the index's own 'optimize').
        with transaction.atomic(), connection.cursor() as cursor:
            FACT_DELTA.flush(cursor)
            cursor.execute("INSERT INTO memory_fact_fts(memory_fact_fts) VALUES ('optimize')")

    @contextlib.contextmanager
    def bulk_load(self):
        # New rows wait in the indexes' deltas, which triggers move into the indexes every 256 rows.
        # Inside the caller's transaction (SQLite's write lock is held, so no other writer can add to
        # a delta meanwhile) those triggers are set aside, the whole load goes in as one segment per
        # index at the end, and the triggers are restored from their own stored definitions; a
        # rollback restores them too.
        if not connection.in_atomic_block:
            raise RuntimeError("bulk_load() must run inside a transaction")
        deltas = (FACT_DELTA, RECALL_DELTA)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name IN ({', '.join(['%s'] * len(deltas))})",
                [d.flush_trigger for d in deltas],
            )
            triggers = [row[0] for row in cursor.fetchall()]
            for delta in deltas:
                cursor.execute(f"DROP TRIGGER IF EXISTS {delta.flush_trigger}")
        yield
        with connection.cursor() as cursor:
            for delta in deltas:
                delta.flush(cursor)
            for sql in triggers:
                cursor.execute(sql)

    def like_filter(self, token):
        # The pattern as an expression (unary +, which leaves a value as it is), not a bare
        # parameter: SQLite's planner reads a bare LIKE parameter (for its prefix optimization,
        # useless to a pattern that starts with %), so each new search word would parse and plan the
        # whole statement again instead of reusing the prepared one.
        return f"f.search_text LIKE +%s{self.like_escape}", f"%{escape_like(token)}%"

    def fact_candidates(self, tokens, viewer, best_first):
        indexed = indexable_words(tokens)
        rarest = selective_word(indexed, self.stats.token_rows(indexed)) if indexed else None
        if rarest is not None:
            # NOT INDEXED: rows by id from the match only (the id lookups still run); with a
            # minimum confidence the planner would otherwise walk the owners' confidence index.
            return (f"{FACT_TABLE} f NOT INDEXED", *self._match_owned(rarest, viewer))
        if best_first:
            return WALK_OWNERS
        return f"{FACT_TABLE} f", None, []

    def _match_owned(self, token, viewer):
        """Rows holding `token` that belong to one of the viewer's owners: one MATCH, plus the
        viewer's facts still waiting in the index's delta (the shared query checks both exactly).

        As `f.id IN (...)`, so SQLite looks the few ids up; joined as a subquery, the union's
        unknown size made it filter through a Bloom filter built by scanning every fact.
        """
        static = [owner_marker(k) for k in owner_keys(viewer, include_user=False)]
        head = f"{_phrase(token)} AND (" + " OR ".join(_phrase(m) for m in static)
        if viewer.user_id is None:
            match_sql, params = "%s", [head + ")"]
        else:  # the user's marker follows merges inside the query, like the owner filter does
            match_sql = f"%s || engram_owner_marker({USER_OWNER_SQL}) || '\")'"
            params = [head + ' OR "', viewer.user_id, viewer.user_id]
        branches = [f"SELECT rowid FROM memory_fact_fts WHERE memory_fact_fts MATCH {match_sql}"]
        if viewer.agent_id:
            # One MATCH per team of the agent (none for an agent in no team), its marker from the
            # membership table: a team's id is known only inside the query.
            branches.append(
                f"SELECT memory_fact_fts.rowid FROM ({TEAMS_SQL}) t CROSS JOIN memory_fact_fts "
                "WHERE memory_fact_fts MATCH (%s || engram_owner_marker(t.owner) || '\"')"
            )
            params += [viewer.agent_id, f'{_phrase(token)} AND "']
        owners, owner_params = owners_sql(viewer, "scope_key", probe=False)
        branches.append(f"SELECT fact_id FROM memory_fact_fts_pending WHERE {owners}")
        return f"f.id IN ({' UNION '.join(branches)})", [*params, *owner_params]

    def procedure_match_sql(self, goal, context_keys):
        return (
            "(json_type(memory_procedure.trigger_conditions, '$.goal_contains') IS NULL OR EXISTS ("
            "SELECT 1 FROM json_each(memory_procedure.trigger_conditions, '$.goal_contains') AS kw "
            "WHERE instr(%s, lower(kw.value)) > 0)) "
            "AND (json_type(memory_procedure.trigger_conditions, '$.context_has') IS NULL OR NOT EXISTS ("
            "SELECT 1 FROM json_each(memory_procedure.trigger_conditions, '$.context_has') AS k "
            "WHERE k.value NOT IN (SELECT value FROM json_each(%s))))",
            [goal.lower(), json.dumps(sorted(context_keys))],
        )

    # ---- recall: BM25 over the FTS5 recall index (porter stemming), two exact plans
    #
    # A viewer who owns a small share of the documents: one MATCH for the words AND the viewer's
    # owner markers (the index narrows to its owners). One who owns most of them (one big scope):
    # the marker's doclist is nearly the whole index and reading it costs more than the words' own
    # matches, so MATCH the words and keep
    # the viewer's rows by joining their documents. Both give the same rows; statistics only steer.

    def recall_keyword(self, terms, owners, depth):
        if not terms or not owners:
            return []
        words = " OR ".join(_phrase(t) for t in terms)
        # Inside a workspace the documents are joined for theirs (owner markers are the same in
        # every workspace): another workspace's matches never take one of the `depth` places.
        workspace_id = current_workspace_id()
        scoped, scope_params = ("AND d.workspace_id = %s ", [workspace_id]) if workspace_id is not None else ("", [])
        if self.recall_stats.share(owners) >= _RECALL_JOIN_SHARE:
            sql = (
                "SELECT f.rowid, -f.rank FROM memory_recall_fts f CROSS JOIN memory_recall_doc d ON d.id = f.rowid "
                f"WHERE memory_recall_fts MATCH %s AND d.owner IN ({', '.join(['%s'] * len(owners))}) {scoped}"
                "ORDER BY f.rank LIMIT %s"
            )
            params = [f"text : ({words})", *owners, *scope_params, depth]
        else:
            marks = " OR ".join(_phrase(owner_marker(o)) for o in owners)
            match = f"text : ({words}) AND owner : ({marks})"
            if scoped:
                sql = (
                    "SELECT f.rowid, -f.rank FROM memory_recall_fts f CROSS JOIN memory_recall_doc d "
                    f"ON d.id = f.rowid WHERE memory_recall_fts MATCH %s {scoped}ORDER BY f.rank LIMIT %s"
                )
            else:
                sql = (
                    "SELECT rowid, -rank FROM memory_recall_fts WHERE memory_recall_fts MATCH %s ORDER BY rank LIMIT %s"
                )
            params = [match, *scope_params, depth]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()

    # Asked by recall's first query (its owners): BM25 ranks only what the index holds.
    recall_index_behind_sql = (
        f"EXISTS (SELECT 1 FROM {RECALL_DELTA.pending}) OR EXISTS (SELECT 1 FROM {RECALL_DELTA.stale})"
    )

    def catch_up_recall_index(self):
        with transaction.atomic(), connection.cursor() as cursor:
            RECALL_DELTA.flush(cursor)

    def optimize_recall_index(self):
        with transaction.atomic(), connection.cursor() as cursor:
            RECALL_DELTA.flush(cursor)
            cursor.execute("INSERT INTO memory_recall_fts(memory_recall_fts) VALUES ('optimize')")
