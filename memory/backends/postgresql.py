"""PostgreSQL backend: a pg_trgm GIN index serves substring search; jsonb matches procedures."""

import json

from django.db import connection

from .base import FACT_TABLE, USER_TABLE, MemoryBackend
from .recall import DOC_TABLE
from .store import postgresql_equality_is_exact, postgresql_field_equals


class PostgreSQLBackend(MemoryBackend):
    vendor = "postgresql"
    store_field_equals = postgresql_field_equals
    store_equality_is_exact = postgresql_equality_is_exact

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

    def fact_candidates(self, tokens, viewer, best_first):
        # The shared LIKE '%token%' filters on search_text are answered by the gin_trgm_ops index.
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
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT d.id, ts_rank(d.tsv, q, 1) FROM {DOC_TABLE} d, to_tsquery('english', %s) q "
                f"WHERE d.tsv @@ q AND d.owner IN ({', '.join(['%s'] * len(owners))}) ORDER BY 2 DESC, d.id LIMIT %s",
                [" | ".join(terms), *owners, depth],
            )
            return cursor.fetchall()
