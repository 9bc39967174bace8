"""The store's reads, shared by the storage backends: items by key, and items under a namespace.

A graph reads its store on every step, so these are hand-written statements built once: through
the ORM most of a get was compiling the queryset (`python -m bench.store` compares). Filters of one
top-level field equal to a string or a number are pushed into the query (SQLite's json_extract,
PostgreSQL's jsonb containment), so a filtered search reads only the matching rows; the service
still checks every filter exactly.
"""

import functools
import json
import re
from collections import namedtuple
from datetime import UTC, datetime

import orjson
from django.db import DEFAULT_DB_ALIAS, connections

from ..models import StoreItem
from ..models.workspaces import current_workspace_id
from .rows import Columns, execute, fetch_rows

_TABLE = StoreItem._meta.db_table
# What a store read hands out: a row, not a model instance (building one cost a fifth of a get).
StoredItem = namedtuple("StoredItem", "pk namespace key value created_at updated_at ttl_minutes expires_at")
STORE_NAMES = ("id", "namespace", "key", "value", "created_at", "updated_at", "ttl_minutes", "expires_at")
STORE_COLUMNS = Columns([StoreItem._meta.get_field(name) for name in STORE_NAMES])
_SELECT = "SELECT " + ", ".join(f's."{name}"' for name in STORE_NAMES) + f" FROM {_TABLE} s"
# A query search also reads what it scores: the indexed text and the vector. (Both lists follow the
# model's field order, which Model.from_db expects of a partial row.)
SEARCH_NAMES = ("id", "namespace", "key", "value", "text", "embedding", *STORE_NAMES[4:])
SEARCH_COLUMNS = Columns([StoreItem._meta.get_field(name) for name in SEARCH_NAMES])
ScoredItem = namedtuple("ScoredItem", ["pk", *SEARCH_NAMES[1:]])
_SELECT_SCORED = "SELECT " + ", ".join(f's."{name}"' for name in SEARCH_NAMES) + f" FROM {_TABLE} s"
_ALIVE = "(s.expires_at IS NULL OR s.expires_at > %s)"
_FIELD = re.compile(r"^[A-Za-z0-9_-]{1,100}$")


def _in_current_workspace(sql, params):
    """`sql` (ending in a WHERE clause) narrowed to the current workspace's items, if one is current."""
    workspace_id = current_workspace_id()
    if workspace_id is None:
        return sql, params
    return f"{sql} AND s.workspace_id = %s", [*params, workspace_id]


def _chunks(values, size):
    return [values[i : i + size] for i in range(0, len(values), size)]


def pushable(name, wanted):
    """Whether `{name: wanted}` can be decided in SQL exactly: a plain top-level field, a string or number."""
    return bool(_FIELD.match(name)) and isinstance(wanted, (str, int, float)) and not isinstance(wanted, bool)


class StoreSQL:
    """Mixed into MemoryBackend: the statements EngramStore's reads run."""

    def store_rows_by_key(self, pairs, now):
        """Rows (in STORE_COLUMNS order) of these (joined namespace, key) pairs that have not expired."""
        conn = connections[DEFAULT_DB_ALIAS]
        when = StoreItem._meta.get_field("expires_at").get_db_prep_value(now, conn)
        if len(pairs) == 1:
            sql, params = f'{_SELECT} WHERE s.namespace = %s AND s."key" = %s AND {_ALIVE}', [*pairs[0], when]
        else:
            pair = '(s.namespace = %s AND s."key" = %s)'
            sql = f"{_SELECT} WHERE ({' OR '.join([pair] * len(pairs))}) AND {_ALIVE}"
            params = [p for namespace_key in pairs for p in namespace_key] + [when]
        sql, params = _in_current_workspace(sql, params)
        return fetch_rows(sql, params, STORE_COLUMNS)

    def store_rows_under(self, prefix, now, equal_to, limit, *, scored=False):
        """Rows under the joined namespace `prefix` ("" for all) whose fields equal `equal_to`, newest first
        (in STORE_COLUMNS order; SEARCH_COLUMNS when `scored`)."""
        sql, params = self.store_under_sql(prefix, now, equal_to, limit, scored=scored)
        return fetch_rows(sql, params, SEARCH_COLUMNS if scored else STORE_COLUMNS)

    def store_namespace_names(self, prefix, now):
        """The distinct joined namespaces under the joined `prefix` ("" for all) holding an item alive at `now`.

        A loose index scan: one seek in the (namespace, key) unique index per distinct namespace (the
        next name after the last one), so a listing costs the number of namespaces, not of items. The
        few namespaces with an expired item are then checked for one still alive (expired items wait
        for a sweep, and a namespace with none alive is not listed).
        """
        conn = connections[DEFAULT_DB_ALIAS]
        when = StoreItem._meta.get_field("expires_at").get_db_prep_value(now, conn)
        # The range holds the prefix and every "<prefix>.<more>" ("/" sorts right after "."), and names
        # like "<prefix>-x" too, which the caller's label check drops. Without a prefix: every name
        # (U+10FFFF sorts after any text a label can hold).
        low, high = (prefix, prefix + "/") if prefix else ("", "\U0010ffff")
        with conn.cursor() as cursor:
            cursor.execute(
                f"""WITH RECURSIVE names(name) AS (
                    SELECT MIN(namespace) FROM {_TABLE} WHERE namespace >= %s AND namespace < %s
                    UNION ALL
                    SELECT (SELECT MIN(namespace) FROM {_TABLE} WHERE namespace > names.name AND namespace < %s)
                    FROM names WHERE names.name IS NOT NULL
                ) SELECT name FROM names WHERE name IS NOT NULL""",
                [low, high, high],
            )
            names = {row[0] for row in cursor.fetchall()}
            # By the expiry index alone: with the prefix, or DISTINCT, SQLite's planner walks every row of
            # the unique index instead (the names are made distinct here).
            cursor.execute(f"SELECT s.namespace FROM {_TABLE} s WHERE s.expires_at <= %s", [when])
            expired = {row[0] for row in cursor.fetchall()} & names
            if expired:
                alive = set()
                for chunk in _chunks(sorted(expired), 400):
                    marks = ", ".join(["%s"] * len(chunk))
                    cursor.execute(
                        f"SELECT DISTINCT s.namespace FROM {_TABLE} s WHERE s.namespace IN ({marks}) AND {_ALIVE}",
                        [*chunk, when],
                    )
                    alive.update(row[0] for row in cursor.fetchall())
                names -= expired - alive
            workspace_id = current_workspace_id()
            if workspace_id is not None and names:
                mine = set()
                for chunk in _chunks(sorted(names), 400):
                    marks = ", ".join(["%s"] * len(chunk))
                    cursor.execute(
                        f"SELECT DISTINCT s.namespace FROM {_TABLE} s WHERE s.namespace IN ({marks}) "
                        "AND s.workspace_id = %s",
                        [*chunk, workspace_id],
                    )
                    mine.update(row[0] for row in cursor.fetchall())
                names &= mine
        return names

    def store_under_sql(self, prefix, now, equal_to, limit, *, scored=False, select=None):
        """(SQL with %s placeholders, params) of store_rows_under; `select` replaces the column list."""
        conn = connections[DEFAULT_DB_ALIAS]
        where = [_ALIVE]
        params = [StoreItem._meta.get_field("expires_at").get_db_prep_value(now, conn)]
        workspace_id = current_workspace_id()
        if workspace_id is not None:
            where.append("s.workspace_id = %s")
            params.append(workspace_id)
        if prefix:
            where.append("(s.namespace = %s OR (s.namespace >= %s AND s.namespace < %s))")
            params += [prefix, prefix + ".", prefix + "/"]
        for name, wanted in equal_to.items():
            condition, value = self.store_field_equals(name, wanted)
            where.append(condition)
            params.append(value)
        select = select or (_SELECT_SCORED if scored else _SELECT)
        sql = f'{select} WHERE {" AND ".join(where)} ORDER BY s.updated_at DESC, s.namespace, s."key"'
        if limit is not None:
            sql += " LIMIT %s"
            params.append(limit)
        return sql, params

    def store_upsert(self, rows):
        """Insert these rows ({field attname: value} of StoreItem), or update the item already at their (namespace, key) in
        their workspace (its created_at kept); returns {(namespace, key): id}. Run inside the caller's transaction.

        One statement per UPSERT_BATCH rows, built once per batch size: through `bulk_create` a
        single put spent most of its time compiling the statement. Values go through each field's
        own get_db_prep_save, as the ORM's would.
        """
        conn = connections[DEFAULT_DB_ALIAS]
        ids = {}
        with conn.cursor() as cursor:
            for start in range(0, len(rows), UPSERT_BATCH):
                batch = rows[start : start + UPSERT_BATCH]
                params = [field.get_db_prep_save(row[field.attname], conn) for row in batch for field in _UPSERT_FIELDS]
                execute(cursor, _upsert_sql(len(batch)), params)
                ids.update({(namespace, key): pk for pk, namespace, key in cursor.fetchall()})
        return ids

    def store_field_equals(self, name, wanted):
        """(SQL condition on `s`, its parameter): the item's top-level field `name` equals `wanted`."""
        raise NotImplementedError("MemoryBackend subclasses must provide store_field_equals(name, wanted)")


UPSERT_BATCH = 50  # 12 parameters a row: 600 per statement, under every backend's limit
_UPSERT_FIELDS = [f for f in StoreItem._meta.concrete_fields if not f.primary_key]
# On a conflict everything but created_at is the new write's (the fields bulk_create updated).
_UPSERT_UPDATE = [f.column for f in _UPSERT_FIELDS if f.name not in ("workspace", "namespace", "key", "created_at")]


@functools.lru_cache(maxsize=UPSERT_BATCH)
def _upsert_sql(count):
    columns = ", ".join(f'"{f.column}"' for f in _UPSERT_FIELDS)
    marks = "(" + ", ".join(["%s"] * len(_UPSERT_FIELDS)) + ")"
    updates = ", ".join(f'"{c}" = excluded."{c}"' for c in _UPSERT_UPDATE)
    return (
        f"INSERT INTO {_TABLE} ({columns}) VALUES {', '.join([marks] * count)} "
        # (namespace, key) is unique per workspace: a write meets only its own workspace's item.
        f'ON CONFLICT ("namespace", "key", "workspace_id") DO UPDATE SET {updates} RETURNING "id", "namespace", "key"'
    )


def sqlite_field_equals(backend, name, wanted):
    return f"json_extract(s.value, '$.\"{name}\"') = %s", wanted


def sqlite_equality_is_exact(backend, wanted):
    """json_extract(...) = wanted matches exactly what == does, except that a nested object or array is
    compared as its JSON text: only a string that starts like one could match one wrongly."""
    return not (isinstance(wanted, str) and wanted[:1] in ("{", "["))


def postgresql_equality_is_exact(backend, wanted):
    """jsonb containment differs from == at the edges (an array contains its elements): always re-check."""
    return False


def postgresql_field_equals(backend, name, wanted):
    if _holds_nul(wanted):
        # jsonb cannot hold a NUL character (PostgreSQL refuses the literal): no stored item has this value.
        return "%s", False
    return "s.value @> %s::jsonb", json.dumps({name: wanted})


def _holds_nul(value):
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_nul(v) for v in value)
    return False


class SQLiteStoreReads:
    """SQLite's store reads on the DB-API connection Django holds (inside the same transaction, if any).

    Django's cursor wrapper, placeholder rewrite and per-value converters were most of a get by key;
    this path builds the same rows (JSON decoded, aware datetimes) itself. Filtered searches take the
    same path: Django's converters were a large share of one (three datetimes per row). Both read
    migration 0028's covering index (namespace, key, ..., value) alone, never a table row.
    """

    def store_rows_under(self, prefix, now, equal_to, limit, *, scored=False):
        if scored:
            return StoreSQL.store_rows_under(self, prefix, now, equal_to, limit, scored=True)
        # The statement depends only on the search's shape: built once per shape (building it was a
        # tenth of a search), its parameters in store_under_sql's order.
        workspace_id = current_workspace_id()
        shape = (bool(prefix), tuple(equal_to), limit is not None, workspace_id is not None)
        sql = _SQLITE_UNDER.get(shape)
        if sql is None:
            if len(_SQLITE_UNDER) > 256:
                _SQLITE_UNDER.clear()
            sql = self.store_under_sql(prefix, now, equal_to, limit, select=_SQLITE_SELECT)[0].replace("%s", "?")
            _SQLITE_UNDER[shape] = sql
        params = [
            _utc_text(now),
            *(() if workspace_id is None else (workspace_id,)),
            *((prefix, prefix + ".", prefix + "/") if prefix else ()),
            *equal_to.values(),
        ]
        return _sqlite_rows(sql, params if limit is None else [*params, limit])

    def store_rows_by_key(self, pairs, now):
        if len(pairs) != 1 or current_workspace_id() is not None:
            return StoreSQL.store_rows_by_key(self, pairs, now)
        return _sqlite_rows(_SQLITE_BY_KEY, (*pairs[0], _utc_text(now)))


def _utc_text(now):
    """A datetime as SQLite's columns hold it (naive UTC text), to compare with them."""
    return (now if now.tzinfo is UTC else now.astimezone(UTC)).replace(tzinfo=None).isoformat(" ")


_SQLITE_UNDER = {}


def _sqlite_rows(sql, params):
    """STORE_NAMES rows of a _SQLITE_SELECT statement run on the DB-API connection, converted as the ORM
    would (values with orjson, as LangGraph's SqliteStore reads them: a third of json's time)."""
    conn = connections[DEFAULT_DB_ALIAS]
    raw = conn.connection
    if raw is None:  # (ensure_connection's own checks cost a tenth of a get: only when there is none)
        conn.ensure_connection()
        raw = conn.connection
    rows = raw.execute(sql, params).fetchall()
    return [
        StoredItem(pk, ns, key, orjson.loads(value), _aware(created), _aware(updated), ttl, _aware(expires))
        for pk, ns, key, value, created, updated, ttl, expires in rows
    ]


# The datetimes are read as text marked UTC (Django stores them naive in UTC), so one C call makes
# each an aware datetime: the driver's own converter plus a tzinfo replace was a tenth of a get.
_SQLITE_SELECT = (
    "SELECT "
    + ", ".join(
        f"s.{name} || '+00:00'" if name in ("created_at", "updated_at", "expires_at") else f's."{name}"'
        for name in STORE_NAMES
    )
    + f" FROM {_TABLE} s"
)
# By the covering index of migration 0028 (the planner prefers the unique index, which then reads the
# table row, half a page when it holds a vector).
_SQLITE_BY_KEY = (
    f"{_SQLITE_SELECT} INDEXED BY memory_store_item_under"
    ' WHERE s.namespace = ? AND s."key" = ? AND (s.expires_at IS NULL OR s.expires_at > ?)'
)


def _aware(value):
    """A stored UTC datetime as _SQLITE_SELECT reads it ("... +00:00"), aware."""
    return None if value is None else datetime.fromisoformat(value)
