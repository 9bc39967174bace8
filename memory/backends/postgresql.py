"""PostgreSQL backend: a GIN index of owner and trigrams serves substring search; jsonb matches procedures.

Search plans, chosen per query from a sample of the facts' texts (the planner's own statistics):
- a selective word: the trigram index for that word alone, the other words checked on its rows;
- only broad words, best-first with a limit: walk each owner's facts by confidence, stopping at the limit;
- no statistics yet (a table never analyzed): every word through the index, as the planner likes.

PostgreSQL's planner cannot tell a selective word from a broad one through a trigram index: for
"key 1234" over facts that all say "key" it intersects both words' posting lists, reading the whole
broad one where the selective word alone would answer at once.
"""

import json
import math
import time

from django.db import connection

from ..models.workspaces import current_workspace_id
from .base import (
    FACT_TABLE,
    USER_TABLE,
    WALK_OWNERS,
    MemoryBackend,
    fact_update_sql,
    indexable_words,
    selective_word,
    supersede_sql,
)
from .recall_index import DOC_TABLE
from .space import postgresql_scrub
from .store_rows import postgresql_equality_is_exact, postgresql_field_equals

# The state a write replaces is kept as a version by the write's own statement (a CTE sees the row
# as it was before the statement): one round trip, not two.


class PostgreSQLBackend(MemoryBackend):
    vendor = "postgresql"
    scrub_after_erasure = postgresql_scrub
    # The forget takes FOR UPDATE on the person's row, which conflicts with this (memory/rules/persons.py).
    hold_people_lock_sql = " FOR NO KEY UPDATE"

    def reclaim_space(self):
        return 0  # autovacuum reclaims dead rows itself

    def begin_snapshot(self):
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")

    store_field_equals = postgresql_field_equals
    store_equality_is_exact = postgresql_equality_is_exact

    def __init__(self):
        self.sample = SearchTextSample()

    def hold_user(self, user_id):
        """Share-lock the survivor row, so a merge (FOR UPDATE on both users) waits for this write.

        Without it, a write by an old id that read "no merge yet" while a merge of that user was in
        flight committed after it, under the merged-away user. FOR KEY SHARE is the lock a foreign key
        check takes: writers of one user do not wait for each other. A merge that commits between the
        two reads is seen on the next turn of the loop (READ COMMITTED re-reads the locked row).
        """
        with connection.cursor() as cursor:
            while True:
                cursor.execute(
                    f"SELECT id, merged_into_id FROM {USER_TABLE} WHERE id = "
                    f"(SELECT COALESCE(merged_into_id, id) FROM {USER_TABLE} WHERE id = %s) FOR KEY SHARE",
                    [user_id],
                )
                row = cursor.fetchone()
                if row is None or row[1] is None:  # unknown (the insert says so) or a held survivor
                    return
                user_id = row[0]

    def update_fact(self, pk, changes, supersede=False, closes=None):
        if not supersede:
            return super().update_fact(pk, changes)
        sql, params = fact_update_sql(changes)
        copy, copy_params = supersede_sql(closes, connection)
        with connection.cursor() as cursor:
            cursor.execute(f"WITH superseded AS ({copy}) {sql}", [*copy_params, pk, *params, pk])

    def optimize(self):
        _merge_pending("memory_fact_owner_search_trgm")

    def optimize_recall_index(self):
        _merge_pending("memory_recall_doc_tsv")

    def token_filter(self, token):
        # Not a LIKE: the trigram index then serves only the word fact_candidates picked.
        return "strpos(f.search_text, %s) > 0", token

    def fact_candidates(self, tokens, viewer, best_first):
        indexed = indexable_words(tokens)
        rows = self.sample.token_rows(indexed)
        if rows is None:  # no statistics: the index for every word it can serve
            likes = [self.like_filter(t) for t in indexed]
            return f"{FACT_TABLE} f", " AND ".join(sql for sql, _ in likes) or None, [p for _, p in likes]
        rarest = selective_word(indexed, rows)
        if rarest is not None:
            sql, param = self.like_filter(rarest)
            return f"{FACT_TABLE} f", sql, [param]
        if best_first:
            return WALK_OWNERS
        return f"{FACT_TABLE} f", None, []

    def procedure_match_sql(self, goal, context_keys):
        return (
            "(memory_procedure.trigger_conditions -> 'goal_contains' IS NULL OR EXISTS ("
            "SELECT 1 FROM jsonb_array_elements_text(memory_procedure.trigger_conditions -> 'goal_contains') "
            "AS kw(v) WHERE strpos(%s, lower(kw.v)) > 0)) "
            "AND (memory_procedure.trigger_conditions -> 'context_has' IS NULL OR "
            "(memory_procedure.trigger_conditions -> 'context_has') <@ %s::jsonb)",
            [goal.lower(), json.dumps(sorted(context_keys))],
        )

    # ---- recall: full-text search (english configuration) ranked by ts_rank, any word matching.
    # Normalization 1 divides the rank by 1 + log(document length), as BM25 (SQLite's FTS5) weighs
    # length: "name: Ada" matches "name" better than a long text that also says "name". Without it
    # the two tie and the vector leg's slightest preference decides.

    def recall_keyword(self, terms, owners, depth):
        if not terms or not owners:
            return []
        # Owners are the same text in every workspace: inside one, only its documents are candidates.
        workspace_id = current_workspace_id()
        scoped, scope_params = (" AND d.workspace_id = %s", [workspace_id]) if workspace_id is not None else ("", [])
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT d.id, ts_rank(d.tsv, q, 1) FROM {DOC_TABLE} d, to_tsquery('english', %s) q "
                f"WHERE d.tsv @@ q AND d.owner IN ({', '.join(['%s'] * len(owners))}){scoped} "
                "ORDER BY 2 DESC, d.id LIMIT %s",
                [" | ".join(terms), *owners, *scope_params, depth],
            )
            return cursor.fetchall()


def _merge_pending(index):
    """GIN indexes take new rows into a pending list that every search reads whole (up to
    gin_pending_list_limit, 4 MB) until vacuum merges it: after a bulk load, merge it now."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT gin_clean_pending_list(%s::regclass)", [index])


_SAMPLE_TTL_S = 300.0  # statistics only steer the plan, never what matches
_SAMPLE_MAX = 1000  # texts kept from the histogram (a raised statistics target keeps up to 10,000)


class SearchTextSample:
    """How many facts hold a word, estimated from the planner's sample of search_text (pg_stats),
    refreshed every few minutes. ANALYZE (autovacuum's, or a bulk load's) keeps the sample current."""

    def __init__(self):
        # (when read, the sample): the sample is (most common values and their shares, other
        # values, their share, rows), or None. One tuple, replaced whole: readers need no lock.
        self._state = (-_SAMPLE_TTL_S * 2, None)

    def token_rows(self, tokens):
        """{token: estimated facts containing it}, or None while the table has no statistics."""
        sample = self._current()
        if sample is None:
            return None
        common, others, others_share, total = sample
        found = {}
        for token in tokens:
            share = sum(freq for value, freq in common if token in value)
            if others:
                share += others_share * sum(token in value for value in others) / len(others)
            found[token] = share * total
        return found

    def _current(self):
        now = time.monotonic()
        read_at, sample = self._state
        if now - read_at > _SAMPLE_TTL_S:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT s.most_common_vals::text::text[], s.most_common_freqs, "
                    "s.histogram_bounds::text::text[], s.null_frac, c.reltuples "
                    "FROM pg_stats s JOIN pg_class c ON c.relname = s.tablename "
                    "AND c.relnamespace = to_regnamespace(s.schemaname) "
                    "WHERE s.schemaname = current_schema() AND s.tablename = %s AND s.attname = 'search_text'",
                    [FACT_TABLE],
                )
                row = cursor.fetchone()
            sample = None
            if row is not None and row[4] > 0:
                common = list(zip(row[0] or [], row[1] or []))
                others_share = max(0.0, 1.0 - row[3] - sum(freq for _, freq in common))
                others = row[2] or []
                others = others[:: max(1, math.ceil(len(others) / _SAMPLE_MAX))]  # evenly spaced
                sample = (common, others, others_share, row[4])
            self._state = (now, sample)
        return sample
