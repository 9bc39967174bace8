"""Recall SQL shared by the storage backends: the viewer's owners, candidate checks, session neighbours.

Vendor-specific keyword ranking (`recall_keyword`) lives with each backend: SQLite FTS5 BM25,
PostgreSQL full-text search.
"""

from django.db import connection

from ..exceptions import MemoryNotFound
from ..models import Episode, MemoryUser, RecallDocument, Scope
from ..models.owners import agent_suffix, is_owner_set, owner_prefix
from ..models.workspaces import current_workspace_id

DOC_TABLE = RecallDocument._meta.db_table
EPISODE_TABLE = Episode._meta.db_table
SCOPE_TABLE = "memory_recall_scope"

# The item's time as Unix seconds, computed by the database (cheaper than converting timestamps).
_EPOCH = {
    "sqlite": "((julianday(d.item_time) - 2440587.5) * 86400.0)",
    "postgresql": "EXTRACT(EPOCH FROM d.item_time)::float",
}


def _off_index(column):
    """`column` in a WHERE term that SQLite must not serve from an index. Without statistics (nothing
    runs ANALYZE on a SQLite store) SQLite took the (kind, item_id) index for a test on the kind and
    read every document of that kind to find the few hundred asked for by id. A unary + keeps a term
    off any index (SQLite's documented way); PostgreSQL plans by its statistics and has no + for text.
    """
    return f"+{column}" if connection.vendor == "sqlite" else column


class RecallSQL:
    """Mixed into MemoryBackend: the recall queries both databases share."""

    # SQL true when the keyword index lacks recent changes (see catch_up_recall_index).
    recall_index_behind_sql = "0"

    def recall_keyword(self, terms, owners, depth):
        """[(document id, score)] of the `depth` best keyword matches among `owners` (of the current
        workspace's documents, if one is current), best first.

        Scores are positive and larger is better; they need only be comparable within one call.
        """
        raise NotImplementedError("MemoryBackend subclasses must provide recall_keyword(terms, owners, depth)")

    def recall_owners(self, viewer, owner_terms, user_owner_sql):
        """[(owner, rank, generation, removed)] the viewer sees, in one query.

        The user's owner follows merges inside the query. Besides the fact owners (session, user,
        agent, global) a viewer with a user and an agent sees "user:<id>/agent:<id>": the episodes
        that agent had with that user. Recall asks this first, so the same query also says whether
        the keyword index is behind, and it is caught up before anything reads it, and whether the
        viewer's user exists: MemoryNotFound if not (forgotten, or never there).
        """
        terms = list(owner_terms(viewer))
        if viewer.user_id is not None and viewer.agent_id:
            terms.append(
                (f"{user_owner_sql} || %s", [viewer.user_id, viewer.user_id, agent_suffix(viewer.agent_id)], 1)
            )
        # One row per owner key; a term of many keys (an agent's teams) adds its subquery's rows.
        single = [term for term in terms if not is_owner_set(term[0])]
        sets = [term for term in terms if is_owner_set(term[0])]
        values = ", ".join(f"({sql}, {rank})" for sql, _, rank in single)
        values += "".join(f" UNION ALL SELECT t.owner, {rank} FROM ({sql}) t" for sql, _, rank in sets)
        params = [p for _, term_params, _ in [*single, *sets] for p in term_params]
        # Whether the viewer's user exists, in the same query: a forgotten (or unknown) id recalls
        # nothing, nor a person of another workspace than the current one.
        workspace_id = current_workspace_id()
        person_params = [viewer.user_id] if viewer.user_id else []
        person = f"EXISTS (SELECT 1 FROM {MemoryUser._meta.db_table} WHERE id = %s" if viewer.user_id else "(1 = 1"
        if viewer.user_id and workspace_id is not None:
            person += " AND workspace_id = %s"
            person_params.append(workspace_id)
        person += ")"
        sql = (
            f"WITH o(k, r) AS (VALUES {values}) "
            f"SELECT o.k, o.r, s.generation, s.removed, {self.recall_index_behind_sql}, {person} "
            f"FROM o LEFT JOIN {SCOPE_TABLE} s ON s.owner = o.k"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, *person_params])
            rows = cursor.fetchall()
        if rows and not rows[0][5]:
            raise MemoryNotFound("memory user", viewer.user_id)
        if rows and rows[0][4]:
            self.catch_up_recall_index()
        return [(k, int(r), g, rm) for k, r, g, rm, _, _ in rows]

    def recall_documents(self, doc_ids, owners, kinds, min_confidence, *, for_person=False):
        """The candidates a viewer may be shown, with what ranking needs. One query.

        Keeps documents of the viewer's owners (in the current workspace, if one is), of the wanted
        kinds, active, facts at or above `min_confidence`, and not shadowed: a fact (or an active
        procedure) of a more specific owner with the same key (name) and workspace hides one of a less
        specific owner, whatever the filters say of it.
        `for_person` (a viewer with a user): episodes with no user (an agent's, or everyone's) are left
        out. A conversation without an identified person may hold anyone's words (a run whose user
        could not be identified), so it is never shown to a person; the agent alone still sees it.
        Returns {id: (kind, item_id, owner, importance, item time in Unix seconds, reference_count,
        asking, length)}: asking is, for an episode, the share of its sentences that are questions (its
        "?" among its ".", "!" and "?", an unended last sentence counting as one more), 1 for a bare
        question, 0 for a text that only states; 0 for facts and procedures. What is asked is weak
        evidence of what is so (memory/recall/ranking.py, step 4). length: an episode document's, in
        characters (0 for facts and procedures).
        """
        if not doc_ids:
            return {}
        values = ", ".join(["(%s, %s)"] * len(owners))
        params = [p for owner, rank in owners for p in (owner, rank)]
        where = [
            "o.k = d.owner",
            f"d.id IN ({', '.join(['%s'] * len(doc_ids))})",
            f"{_off_index('d.kind')} IN ({', '.join(['%s'] * len(kinds))})",
        ]
        params += [*doc_ids, *kinds]
        workspace_id = current_workspace_id()
        if workspace_id is not None:
            where.append("d.workspace_id = %s")
            params.append(workspace_id)
        if min_confidence:
            where.append("(d.kind <> 'fact' OR d.importance >= %s)")
            params.append(min_confidence)
        if for_person:
            person = (owner_prefix(Scope.USER), owner_prefix(Scope.SESSION))
            where.append("(d.kind <> 'episode' OR d.owner LIKE '{}%%' OR d.owner LIKE '{}%%')".format(*person))
        sql = (
            f"WITH viewer_owners(k, r) AS (VALUES {values}) "
            f"SELECT d.id, d.kind, d.item_id, d.owner, d.importance, {_EPOCH[connection.vendor]}, d.reference_count, "
            "CASE WHEN d.kind = 'episode' THEN length(d.text) - length(replace(d.text, %s, '')) ELSE 0 END, "
            "CASE WHEN d.kind = 'episode' THEN length(d.text) - length(replace(replace(replace(d.text, %s, ''), %s, ''), %s, '')) "
            "+ CASE WHEN rtrim(d.text) LIKE %s OR rtrim(d.text) LIKE %s OR rtrim(d.text) LIKE %s THEN 0 ELSE 1 END ELSE 0 END, "
            "CASE WHEN d.kind = 'episode' THEN length(d.text) ELSE 0 END "
            # The candidates by primary key, then their owner among the viewer's: CROSS JOIN makes
            # SQLite read d first. Joined the other way, SQLite without statistics (no ANALYZE has
            # run) read every document of the owner through the owner index to find the few hundred
            # asked for, which grows with the owner's size. PostgreSQL plans it alike either way.
            f"FROM {DOC_TABLE} d CROSS JOIN viewer_owners o "
            f"WHERE {' AND '.join(where)} AND d.active AND NOT (d.shadow_key <> '' AND EXISTS ("
            f"SELECT 1 FROM {DOC_TABLE} g JOIN viewer_owners go ON go.k = g.owner "
            "WHERE g.shadow_key = d.shadow_key AND g.kind = d.kind AND g.workspace_id = d.workspace_id "
            "AND g.active AND go.r < o.r))"
        )
        pairs = 2 * len(owners)  # the sentence marks follow the viewer's owners (WITH), before WHERE's
        params = [*params[:pairs], "?", "?", ".", "!", "%?", "%.", "%!", *params[pairs:]]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return {row[0]: (*row[1:7], row[7] / row[8] if row[7] else 0.0, row[9]) for row in cursor.fetchall()}

    def recall_neighbours(self, doc_ids):
        """For episode documents: {doc id: (session id, [doc ids one before, one after, two before, two after])}.

        Neighbours are the episodes around it in the same session with the same agent, user and
        workspace (so the same owner: nothing the viewer could not see), in id order; None where
        there is none.
        """
        if not doc_ids:
            return {}
        same = (
            "p.session_id = e.session_id AND p.agent_id = e.agent_id AND p.workspace_id = e.workspace_id "
            "AND (p.user_id = e.user_id OR (p.user_id IS NULL AND e.user_id IS NULL))"
        )

        def neighbour(before, offset):
            op, order = ("<", "DESC") if before else (">", "ASC")
            episode = (
                f"(SELECT p.id FROM {EPISODE_TABLE} p WHERE {same} AND p.id {op} e.id "
                f"ORDER BY p.id {order} LIMIT 1 OFFSET {offset})"
            )
            return f"(SELECT n.id FROM {DOC_TABLE} n WHERE n.kind = 'episode' AND n.item_id = {episode})"

        # The asked documents by primary key, the kind test kept off the index (_off_index). A
        # VALUES list joined first did no better: with statistics, SQLite scanned the whole table to
        # build a Bloom filter for the join.
        sql = (
            f"SELECT d.id, e.session_id, {neighbour(True, 0)}, {neighbour(False, 0)}, "
            f"{neighbour(True, 1)}, {neighbour(False, 1)} "
            f"FROM {DOC_TABLE} d JOIN {EPISODE_TABLE} e ON e.id = d.item_id "
            f"WHERE {_off_index('d.kind')} = 'episode' AND e.session_id <> '' AND d.id IN ({', '.join(['%s'] * len(doc_ids))})"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, list(doc_ids))
            return {row[0]: (row[1], list(row[2:])) for row in cursor.fetchall()}

    def optimize_recall_index(self):
        """Compact the keyword index after a bulk load (a no-op where the database needs none)."""

    def catch_up_recall_index(self):
        """Bring the keyword index up to date with every document (a no-op where the database keeps it so).

        SQLite's FTS5 index takes changes through a delta (migration 0008) that recall moves in first."""
