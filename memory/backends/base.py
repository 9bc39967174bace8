"""The interface every memory storage backend provides, and the SQL they share.

The hot reads (get, search, list) are hand-written SQL built once per query shape: compiling the
equivalent ORM expression costs more than running the query.
"""

import contextlib
from functools import cache, lru_cache

from django.db import DEFAULT_DB_ALIAS, connection, connections

from ..models import SCOPE_RANK, Episode, Fact, FactVersion, MemoryUser, Procedure, Scope
from ..models.owners import (
    GLOBAL,
    fact_owner_key,
    is_owner_set,
    owner_key,
    owner_match,
    owners_condition,
    team_owners_sql,
    user_owner_sql,
)
from ..models.workspaces import current_workspace_id
from ..rules.validation import chunks
from .recall_index import RecallSQL
from .rows import RowInsert, execute, fetch_models, select_columns
from .store_rows import StoreSQL
from .users import UserSQL

FACT_TABLE = Fact._meta.db_table
USER_TABLE = MemoryUser._meta.db_table
_FIELDS = tuple(Fact._meta.concrete_fields)
_FIELDS_BY_COLUMN = {f.column: f for f in _FIELDS}


def _q(name):
    # Both backends quote identifiers with double quotes; no connection needed to say so.
    return '"' + name + '"'


@cache
def rank_sql(alias):
    """Specificity of a fact row: session 0, user 1, agent 2, team 3, global 4 (lower wins)."""
    whens = " ".join(f"WHEN '{scope}' THEN {rank}" for scope, rank in SCOPE_RANK.items())
    return f"(CASE {alias}.scope {whens} END)"


@cache
def _scopes_up_to(rank):
    """The scopes as specific as `rank` or more, as an SQL list: "'session', 'user'" for the user's rank."""
    return ", ".join(f"'{scope}'" for scope, r in SCOPE_RANK.items() if r <= rank)


def owner_keys(viewer, include_user=True):
    """The scope keys a viewer may see (the user's as given, before following merges), but for its
    teams' (owner_terms reads those inside the query)."""
    keys = [GLOBAL]
    if viewer.agent_id:
        keys.append(owner_key(Scope.AGENT, agent_id=viewer.agent_id))
    if viewer.session_id:
        keys.append(owner_key(Scope.SESSION, session_id=viewer.session_id))
    if include_user and viewer.user_id is not None:
        keys.append(owner_key(Scope.USER, user_id=viewer.user_id))
    return keys


# The scope key of a user, or of the user it was merged into: `merged_into` always names a
# surviving user, so one hop inside the query is enough. Takes the user id twice.
SURVIVOR_SQL = f"COALESCE((SELECT merged_into_id FROM {USER_TABLE} WHERE id = %s), %s)"
USER_OWNER_SQL = user_owner_sql(SURVIVOR_SQL)
# The owner keys of an agent's teams (a subquery on the membership table); takes the agent id.
TEAMS_SQL = team_owners_sql("%s")


def owner_terms(viewer):
    """(SQL, params, rank) for each owner the viewer sees; the user's follows merges in the query,
    and an agent's teams are a subquery (a term of many keys: owner_match, owners_condition)."""
    terms = [("%s", [key], SCOPE_RANK[key.partition(":")[0]]) for key in owner_keys(viewer, include_user=False)]
    if viewer.user_id is not None:
        terms.append((USER_OWNER_SQL, [viewer.user_id, viewer.user_id], SCOPE_RANK[Scope.USER]))
    if viewer.agent_id:
        terms.append((TEAMS_SQL, [viewer.agent_id], SCOPE_RANK[Scope.TEAM]))
    return terms


def owners_sql(viewer, column="f.scope_key", *, probe=True):
    """(SQL condition: `column` is one of the owners a viewer may see, its parameters); `probe`: see
    owners_condition."""
    return owners_condition(column, owner_terms(viewer), probe=probe)


def in_workspace_sql(alias="f"):
    """(SQL condition, params): the row `alias` is of the current workspace; None while no workspace
    is current (unscoped reads keep their statement as it was).

    Owner keys of agents, sessions and everyone are the same text in every workspace, and each
    workspace holds its own (owner, key): the condition belongs in the statement, before any
    ordering, limit or shadowing picks among rows, and the unique (owner, key, workspace) index
    serves it."""
    workspace_id = current_workspace_id()
    return None if workspace_id is None else (f"{alias}.workspace_id = %s", [workspace_id])


def select_list(alias):
    return select_columns(Fact, alias)


def escape_like(token):
    return token.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


# Both backends' substring indexes are built on trigrams (SQLite's FTS5 trigram tokenizer,
# PostgreSQL's pg_trgm): a shorter word cannot narrow them.
TRIGRAM = 3
# A word estimated in more facts than this is "broad": the index would hand back most of the store,
# and walking the viewer's owners best-first (WALK_OWNERS) stops sooner.
SELECTIVE_ROWS = 2000


def indexable_words(tokens):
    return [t for t in tokens if len(t) >= TRIGRAM]


def selective_word(indexed, rows):
    """Of `indexed` words, the one in the fewest facts by `rows` ({word: estimated facts}; of equal
    counts, the longer word) if it is selective, else None."""
    if not indexed:
        return None
    rarest = min(indexed, key=lambda t: (rows[t], -len(t)))
    return rarest if rows[rarest] <= SELECTIVE_ROWS else None


# fact_candidates' answer for "read each owner's facts best-first": one index walk per owner, each
# stopping at the limit, instead of walking the whole store by confidence or sorting every visible fact.
WALK_OWNERS = "walk owners"
# Facts of equal confidence (and rank): the newer first. An owner walk (one scope, so one rank) must
# order exactly as visible_facts' "confidence" does, or its limit could drop a row that wins overall.
_TIE_BREAK = "f.updated_at DESC, f.id"
_WALK_ORDER = f"f.confidence DESC, {_TIE_BREAK}"


class MemoryBackend(RecallSQL, UserSQL, StoreSQL):
    """Database-specific parts of the memory; subclasses fill in the NotImplementedError methods."""

    vendor = None
    like_escape = ""
    owner_walk_hint = ""  # after `FROM memory_fact f` in a WALK_OWNERS walk

    def fact_candidates(self, tokens, viewer, best_first):
        """Where rows that may hold every token come from: (FROM clause aliasing memory_fact as `f`,
        a condition on `f` or None, params), or WALK_OWNERS.

        The shared query still applies the exact owner, text and shadowing filters; this only picks
        where rows come from. `best_first`: the caller orders by confidence and takes a few, and
        WALK_OWNERS may answer it: each owner's facts are read best-first from the (scope_key,
        confidence) index until enough pass the filters.
        """
        raise NotImplementedError("MemoryBackend subclasses must provide fact_candidates(tokens, viewer, best_first)")

    def procedure_match_sql(self, goal, context_keys):
        """(SQL condition over memory_procedure, params): its trigger conditions hold for goal and context.

        `goal_contains`: at least one listed word occurs in the goal (case-insensitive);
        `context_has`: every listed key is in `context_keys`.
        """
        raise NotImplementedError("MemoryBackend subclasses must provide procedure_match_sql(goal, context_keys)")

    def optimize(self):
        """Compact the search index after a bulk load (a no-op where the database needs none)."""

    def begin_snapshot(self):
        """Make the transaction's reads one snapshot (a no-op where a transaction's reads are one already)."""

    @contextlib.contextmanager
    def bulk_load(self):
        """Inside a transaction, around inserts of many items: the search indexes take them in one go on exit.

        The default keeps the database's own indexing as it is.
        """
        yield

    # ---- shared SQL

    def _facts(self, sql, params):
        return fetch_models(Fact, sql, params)

    def get_fact(self, key, viewer):
        """The most specific fact for `key` among the viewer's owners, or None. One query."""
        owners, params = owners_sql(viewer)
        scoped = in_workspace_sql()
        if scoped is not None:
            owners = f"{owners} AND {scoped[0]}"
            params = [*params, *scoped[1]]
        found = self._facts(_get_fact_sql(owners), [key, *params])
        return found[0] if found else None

    def visible_facts(self, viewer, *, tokens=(), min_confidence=None, fact_type=None, order="key", limit=None):
        """Facts the viewer sees whose search_text holds every token, less shadowed ones. One query.

        A fact is shadowed when a more specific visible fact has the same key, whatever the
        confidence of either: it is not what this viewer knows under that key.
        """
        best_first = order == "confidence" and limit is not None
        terms = owner_terms(viewer)
        filters, filter_params = self._fact_filters(terms, tokens, min_confidence, fact_type)
        plan = self.fact_candidates(tokens, viewer, best_first)
        if plan is WALK_OWNERS:
            # The best `limit` of each owner (every filter applied) hold the best `limit` of all.
            walks, params = [], []
            for n, (sql, term_params, _) in enumerate(terms):
                walks.append(
                    f"SELECT id FROM (SELECT f.id FROM {FACT_TABLE} f{self.owner_walk_hint} "
                    f"WHERE {' AND '.join([owner_match('f.scope_key', sql), *filters])} ORDER BY {_WALK_ORDER} LIMIT %s) walk{n}"
                )
                params += [*term_params, *filter_params, limit]
            where = f"f.id IN ({' UNION ALL '.join(walks)})"
            source = f"{FACT_TABLE} f"
        else:
            source, candidates, params = plan
            # The rows come from the candidates (or the whole table): each is checked, not looked up.
            owners, owner_params = owners_condition("f.scope_key", terms, probe=candidates is None)
            where = " AND ".join([*([candidates] if candidates else []), owners, *filters])
            params += owner_params
            params += filter_params
        order_by = {
            "key": f"f.{_q('key')}, f.id",
            "confidence": f"f.confidence DESC, {rank_sql('f')}, {_TIE_BREAK}",
        }[order]
        sql = f"SELECT {select_list('f')} FROM {source} WHERE {where} ORDER BY {order_by}"
        if limit is not None:
            sql += " LIMIT %s"
            params.append(limit)
        return self._facts(sql, params)

    def like_filter(self, token):
        """(SQL condition on `f`, its parameter): the fact's search_text contains `token`, as a LIKE
        (the form a trigram index serves)."""
        return f"f.search_text LIKE %s{self.like_escape}", f"%{escape_like(token)}%"

    def token_filter(self, token):
        """(SQL condition on `f`, its parameter): the fact's search_text contains `token`."""
        return self.like_filter(token)

    def _fact_filters(self, terms, tokens, min_confidence, fact_type):
        """([SQL condition on `f`], params): what a visible fact meets besides its owner: text,
        confidence, type, and not shadowed."""
        where, params = [], []
        scoped = in_workspace_sql()
        if scoped is not None:
            where.append(scoped[0])
            params += scoped[1]
        # Only a fact of the row's own workspace shadows it (unscoped: every workspace's, as before).
        same_workspace = "" if scoped is None else " AND g.workspace_id = f.workspace_id"
        for token in tokens:
            sql, param = self.token_filter(token)
            where.append(sql)
            params.append(param)
        if min_confidence:
            where.append("f.confidence >= %s")
            params.append(min_confidence)
        if fact_type:
            where.append("f.fact_type = %s")
            params.append(fact_type)
        # Shadowing: one unique-index probe per owner more specific than the row (rows of that rank
        # or more specific skip it), rather than a correlated scan of the viewer's owners per row.
        # A set's keys (an agent's teams) are joined in, each probing the same unique index; first,
        # whether the set has any key at all, which the database asks once per statement (it does
        # not depend on the row), so an agent in no team pays one probe, not one per row.
        for sql, term_params, rank in terms:
            if rank < SCOPE_RANK[Scope.GLOBAL]:
                shadowed = f"g.{_q('key')} = f.{_q('key')} AND g.scope_key = "
                if is_owner_set(sql):
                    where.append(
                        f"(f.scope IN ({_scopes_up_to(rank)}) OR NOT EXISTS ({sql}) OR NOT EXISTS "
                        f"(SELECT 1 FROM ({sql}) t CROSS JOIN {FACT_TABLE} g WHERE {shadowed}t.owner{same_workspace}))"
                    )
                    params += [*term_params, *term_params]
                else:
                    where.append(
                        f"(f.scope IN ({_scopes_up_to(rank)}) OR NOT EXISTS (SELECT 1 FROM {FACT_TABLE} g "
                        f"WHERE {shadowed}{sql}{same_workspace}))"
                    )
                    params += term_params
        return where, params

    def matching_procedures(self, goal, context_keys, agent_id, limit):
        """Active procedures of the agent or shared whose trigger conditions hold, best first. One query.

        Best: the smoothed success rate (an untried procedure, 1/2, ranks above a failing one and
        below a good one), then the most used, the agent's own before a shared one, then by name.
        """
        condition, params = self.procedure_match_sql(goal, context_keys)
        table = Procedure._meta.db_table
        scoped = in_workspace_sql(table)
        if scoped is not None:
            condition = f"{condition} AND {scoped[0]}"
            params = [*params, *scoped[1]]
        used = f"CAST({table}.times_used AS DOUBLE PRECISION)"
        succeeded = f"CAST({table}.times_succeeded AS DOUBLE PRECISION)"
        sql = (
            f"SELECT {select_columns(Procedure, table)} FROM {table} "
            f"WHERE {table}.is_active AND {table}.agent_id IN (%s, %s) AND {condition} "
            f"ORDER BY ({succeeded} + 1.0) / ({used} + 2.0) DESC, {table}.times_used DESC, "
            f"{table}.agent_id DESC, {table}.name LIMIT %s"
        )
        return fetch_models(Procedure, sql, [agent_id, "", *params, limit])

    def hold_user(self, user_id):
        """Keep `user_id`'s surviving user from being merged away until this transaction ends.

        A write by a user id stores its row under that id's survivor, read inside the INSERT. SQLite's
        IMMEDIATE transactions already exclude a concurrent merge, so the base does nothing; see the
        PostgreSQL backend.
        """

    # What a writer's hold on a person adds to its SELECT (see hold_people): nothing on SQLite, whose
    # IMMEDIATE transactions already hold the whole database; PostgreSQL locks the rows.
    hold_people_lock_sql = ""

    def hold_people(self, user_ids):
        """Hold these people against a concurrent forget until the transaction ends (the writer's side
        of memory/rules/persons.py); the ids that still exist: write nothing for the others. One query
        per ID_CHUNK ids, in id order."""
        if not connection.in_atomic_block:
            raise RuntimeError("the person lock is taken inside a transaction and held until it ends")
        alive = set()
        with connection.cursor() as cursor:
            for chunk in chunks(sorted({int(u) for u in user_ids})):
                marks = ", ".join(["%s"] * len(chunk))
                cursor.execute(
                    f"SELECT id FROM {USER_TABLE} WHERE id IN ({marks}) ORDER BY id{self.hold_people_lock_sql}", chunk
                )
                alive.update(row[0] for row in cursor.fetchall())
        return alive

    def pinned_facts(self, viewer):
        """The pinned facts the viewer sees, less those a more specific fact of the viewer's with the
        same key hides (as visible_facts shadows). Two queries: the pins, then their keys' owners."""
        owners, params = owners_sql(viewer)
        scoped = in_workspace_sql()
        if scoped is not None:
            owners = f"{owners} AND {scoped[0]}"
            params = [*params, *scoped[1]]
        pinned = self._facts(
            f"SELECT {select_list('f')} FROM {FACT_TABLE} f WHERE f.pinned = %s AND {owners} "
            f"ORDER BY f.{_q('key')}, f.id",
            [True, *params],
        )
        if not pinned:
            return []
        keys = sorted({f.key for f in pinned})
        marks = ", ".join(["%s"] * len(keys))
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT f.{_q('key')}, f.scope FROM {FACT_TABLE} f WHERE {owners} AND f.{_q('key')} IN ({marks})",
                [*params, *keys],
            )
            best = {}
            for key, scope in cursor.fetchall():
                best[key] = min(best.get(key, 9), SCOPE_RANK[scope])
        return [f for f in pinned if SCOPE_RANK[f.scope] == best[f.key]]

    def pinned_procedures(self, agent_id):
        """The agent's and the shared active pinned procedures; the agent's own hides a shared one of its name."""
        # Asked on every recall of a workflow: the backend's own SQL, as building the queryset cost
        # more than the statement.
        table = Procedure._meta.db_table
        sql = (
            f"SELECT {select_columns(Procedure, table)} FROM {table} "
            f"WHERE {table}.pinned = %s AND {table}.is_active = %s AND {table}.agent_id IN (%s, %s)"
        )
        params = [True, True, agent_id, ""]
        scoped = in_workspace_sql(table)
        if scoped is not None:
            sql += f" AND {scoped[0]}"
            params += scoped[1]
        found = fetch_models(Procedure, sql, params)
        own = {p.name for p in found if p.agent_id}
        return sorted((p for p in found if p.agent_id or p.name not in own), key=lambda p: (p.name, p.pk))

    def set_pinned(self, model, ids, pinned):
        """Pin or unpin these rows of Fact or Procedure; how many rows changed."""
        return model.objects.filter(pk__in=ids).exclude(pinned=pinned).update(pinned=pinned)

    def episode_exists(self, episode_id):
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT 1 FROM {Episode._meta.db_table} WHERE id = %s", [episode_id])
            return cursor.fetchone() is not None

    def recent_episodes(self, agent_id, user_id, limit):
        """The latest episodes of an agent and/or a user (following merges), newest first. One query."""
        where, params = [], []
        if agent_id is not None:
            where.append("e.agent_id = %s")
            params.append(agent_id)
        if user_id is not None:
            where.append(f"e.user_id = {SURVIVOR_SQL}")
            params += [user_id, user_id]
        scoped = in_workspace_sql("e")
        if scoped is not None:
            where.append(scoped[0])
            params += scoped[1]
        sql = (
            f"SELECT {select_columns(Episode, 'e')} FROM {Episode._meta.db_table} e "
            f"{'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY e.started_at DESC, e.id DESC LIMIT %s"
        )
        return fetch_models(Episode, sql, [*params, limit])

    def owned_fact(self, fact, *, lock):
        """The stored fact with the owner and key of `fact` (a user id follows merges), or None.

        `lock`: hold the row until the transaction ends (SQLite's IMMEDIATE transactions already
        hold the whole database, so only PostgreSQL adds FOR UPDATE).
        """
        if fact.scope == "user":
            owner = USER_OWNER_SQL
            params = [fact.user_id, fact.user_id]
        else:
            owner = "%s"
            params = [fact_owner_key(fact)]
        # The writer's workspace (the current one, else the default), where its insert would land.
        sql = (
            f"SELECT {select_list('f')} FROM {FACT_TABLE} f "
            f"WHERE f.scope_key = {owner} AND f.{_q('key')} = %s AND f.workspace_id = %s"
        )
        if lock and connection.features.has_select_for_update:
            sql += " FOR UPDATE"
        found = self._facts(sql, [*params, fact.key, fact.workspace_id])
        return found[0] if found else None

    def count_owned_facts(self, scope_key, up_to):
        """How many facts the owner `scope_key` holds, counted no further than `up_to`. One query."""
        scoped = in_workspace_sql()
        where, params = ("", []) if scoped is None else (f" AND {scoped[0]}", scoped[1])
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT COUNT(*) FROM (SELECT 1 FROM {FACT_TABLE} f WHERE f.scope_key = %s{where} LIMIT %s) owned",
                [scope_key, *params, up_to],
            )
            return cursor.fetchone()[0]

    def update_fact(self, pk, changes, supersede=False, closes=None):
        """UPDATE one fact. `changes`: column -> value, or -> (SQL over the old row, params).

        `supersede`: first keep the state this write replaces as a history version (fact history,
        memory/domain/history.py), copied from the row in the database; `closes` (a time): that
        version's valid time ends then (unless it ended before), a later value having replaced it.
        """
        sql, params = fact_update_sql(changes)
        with connection.cursor() as cursor:
            if supersede:
                copy, copy_params = supersede_sql(closes, connection)
                execute(cursor, copy, [*copy_params, pk])
            execute(cursor, sql, [*params, pk])

    # SQLite (>= 3.35) and PostgreSQL speak the same INSERT ... ON CONFLICT ... RETURNING.
    def insert_fact_if_absent(self, fact):
        """Insert `fact` unless its (owner, key) exists in its workspace; True if inserted (its pk is then set).

        A user-scoped fact is stored under the user its `user_id` was merged into, if any, so a
        stale id still writes to the surviving user without another round trip. A create adds no
        history version: the row is its fact's current version.
        """
        row = _FACT_INSERT(fact)
        if row is None:
            return False
        fact.pk, fact.user_id = row
        fact._state.adding = False
        return True

    def insert_episode(self, episode):
        """Insert `episode` in one statement, under the surviving user of its `user_id` (a merge
        followed); sets its pk and user_id. An unknown user id is stored as NULL: check user_id."""
        episode.pk, episode.user_id = _EPISODE_INSERT(episode)
        episode._state.adding = False


# A user id is stored as the surviving user of a merge, or NULL for an unknown id (which a user
# fact's scope constraint refuses at once; a deferred foreign key would only fail at the final commit).
# Unlike SURVIVOR_SQL, which keeps an unknown id as it is (a lookup then simply finds nothing).
SURVIVING_USER = {"user_id": f"(SELECT COALESCE(merged_into_id, id) FROM {USER_TABLE} WHERE id = %s)"}
FACT_INSERT_IF_ABSENT = f"ON CONFLICT (scope_key, {_q('key')}, workspace_id) DO NOTHING"
_FACT_INSERT = RowInsert(Fact, f"{FACT_INSERT_IF_ABSENT} RETURNING id, user_id", placeholders=SURVIVING_USER)


def fact_update_sql(changes):
    """(UPDATE of one fact by a trailing id parameter, its parameters before the id) for update_fact."""
    conn = connections[DEFAULT_DB_ALIAS]
    sets, params = [], []
    for column, change in changes.items():
        if isinstance(change, tuple):
            sets.append(f"{_q(column)} = {change[0]}")
            params.extend(change[1])
        else:
            sets.append(f"{_q(column)} = %s")
            params.append(None if change is None else _FIELDS_BY_COLUMN[column].get_db_prep_save(change, conn))
    return f"UPDATE {FACT_TABLE} SET {', '.join(sets)} WHERE id = %s", params


# ---- fact history: a change first copies the state it supersedes, in the database (nothing is
# read into Python): the fact's values, its current change's action and writer, valid from its updated_at,
# and its valid time (world_from / world_to).
VERSION_TABLE = FactVersion._meta.db_table
_VERSION_COLUMNS = ", ".join(
    _q(c)
    for c in (
        "fact_id", "action", "scope_key", "key", "value", "fact_type", "scope", "user_id", "agent_id",
        "session_id", "confidence", "source_episode_id", "provenance", "valid_from", "world_from", "world_to",
        "recorded_world_to", "team_id", "workspace_id",
    )
)  # fmt: skip
_COPIED = ", ".join(
    "{row}." + _q(c) for c in ("key", "value", "fact_type", "scope", "user_id", "agent_id", "session_id", "confidence")
)
# The writer of a fact's current state: the value's own, unless its change names one (Fact.change_provenance).
CURRENT_EPISODE = (
    "CASE WHEN {row}.change_provenance IS NULL THEN {row}.source_episode_id ELSE {row}.change_source_episode_id END"
)
CURRENT_PROVENANCE = "COALESCE({row}.change_provenance, {row}.provenance)"


def version_copy_sql(row, *, action=None, valid_from=None, episode=None, provenance=None, world_to=None):
    """INSERT ... SELECT of a version of fact row `row` (an alias the caller's FROM names next).

    By default the version is the row's current state (its change's action and writer, valid from
    its updated_at, its valid time); each argument given instead is SQL, its parameters in this
    order: action, episode, provenance, valid_from, world_to.
    """
    return (
        f"INSERT INTO {VERSION_TABLE} ({_VERSION_COLUMNS}) "
        f"SELECT {row}.id, {action or row + '.change_action'}, {row}.scope_key, {_COPIED.format(row=row)}, "
        f"{episode or CURRENT_EPISODE.format(row=row)}, {provenance or CURRENT_PROVENANCE.format(row=row)}, "
        f"{valid_from or row + '.updated_at'}, {row}.valid_from, {world_to or row + '.valid_to'}, {row}.valid_to, "
        f"{row}.team_id, {row}.workspace_id FROM "
    )


SUPERSEDE_FROM = version_copy_sql("f") + f"{FACT_TABLE} f WHERE "
# The same, its valid time closed at a parameter (given twice): the start of the value replacing it,
# unless it ended before (fact history, valid time).
SUPERSEDE_CLOSING_FROM = (
    version_copy_sql("f", world_to="CASE WHEN f.valid_to IS NOT NULL AND f.valid_to <= %s THEN f.valid_to ELSE %s END")
    + f"{FACT_TABLE} f WHERE "
)


def supersede_sql(closes, conn):
    """(the copy of one fact's state before a change, by a trailing id parameter; its parameters
    before the id): closed at `closes` when that is a time."""
    if closes is None:
        return SUPERSEDE_FROM + "f.id = %s", []
    stamp = _FIELDS_BY_COLUMN["updated_at"].get_db_prep_save(closes, conn)
    return SUPERSEDE_CLOSING_FROM + "f.id = %s", [stamp, stamp]


# The surviving user of the run's user: the recall triggers index the episode under its final owner.
_EPISODE_INSERT = RowInsert(Episode, "RETURNING id, user_id", placeholders=SURVIVING_USER)


@lru_cache(maxsize=64)
def _get_fact_sql(owners):
    """get_fact's statement for one shape of viewer (`owners`: its owner condition), built once."""
    return (
        f"SELECT {select_list('f')} FROM {FACT_TABLE} f "
        f"WHERE f.{_q('key')} = %s AND {owners} ORDER BY {rank_sql('f')} LIMIT 1"
    )
