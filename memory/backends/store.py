"""The store's reads, shared by the storage backends: items by key, and items under a namespace.

A graph reads its store on every step, so these are hand-written statements built once: through
the ORM a get took ~770 us on this machine, most of it compiling the queryset (bench.store:
1,293 gets/s against SqliteStore's 23,220). Filters of one top-level field equal to a string or a
number are pushed into the query (SQLite's json_extract, PostgreSQL's jsonb containment), so a
filtered search reads only the matching rows; the service still checks every filter exactly.
"""

import json
import re
from collections import namedtuple
from datetime import UTC, datetime

from django.db import DEFAULT_DB_ALIAS, connections

from ..models import StoreItem
from .rows import Columns, fetch_rows

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
        return fetch_rows(sql, params, STORE_COLUMNS)

    def store_rows_under(self, prefix, now, equal_to, limit, *, scored=False):
        """Rows under the joined namespace `prefix` ("" for all) whose fields equal `equal_to`, newest first
        (in STORE_COLUMNS order; SEARCH_COLUMNS when `scored`)."""
        sql, params = self.store_under_sql(prefix, now, equal_to, limit, scored=scored)
        return fetch_rows(sql, params, SEARCH_COLUMNS if scored else STORE_COLUMNS)

    def store_under_sql(self, prefix, now, equal_to, limit, *, scored=False):
        """(SQL with %s placeholders, params) of store_rows_under."""
        conn = connections[DEFAULT_DB_ALIAS]
        where = [_ALIVE]
        params = [StoreItem._meta.get_field("expires_at").get_db_prep_value(now, conn)]
        if prefix:
            where.append("(s.namespace = %s OR (s.namespace >= %s AND s.namespace < %s))")
            params += [prefix, prefix + ".", prefix + "/"]
        for name, wanted in equal_to.items():
            condition, value = self.store_field_equals(name, wanted)
            where.append(condition)
            params.append(value)
        select = _SELECT_SCORED if scored else _SELECT
        sql = f'{select} WHERE {" AND ".join(where)} ORDER BY s.updated_at DESC, s.namespace, s."key"'
        if limit is not None:
            sql += " LIMIT %s"
            params.append(limit)
        return sql, params

    def store_field_equals(self, name, wanted):
        """(SQL condition on `s`, its parameter): the item's top-level field `name` equals `wanted`."""
        raise NotImplementedError("MemoryBackend subclasses must provide store_field_equals(name, wanted)")


def sqlite_field_equals(backend, name, wanted):
    return f"json_extract(s.value, '$.\"{name}\"') = %s", wanted


def postgresql_field_equals(backend, name, wanted):
    return "s.value @> %s::jsonb", json.dumps({name: wanted})


class SQLiteStoreReads:
    """SQLite's store reads on the DB-API connection Django holds (inside the same transaction, if any).

    Django's cursor wrapper, placeholder rewrite and per-value converters were most of a get that
    SqliteStore answers in ~45 us; this path builds the same rows (JSON decoded, aware datetimes)
    itself. Measured in one session, 5,000 reads by key on 10,000 items, three rounds: 7,493 / 11,304
    / 13,293 per second through Django's cursor, 15,917 / 29,004 / 28,860 here (2.2x, median ratio).
    Filtered searches take the same path: Django's converters were a quarter of one (three datetimes
    per row).
    """

    def store_rows_under(self, prefix, now, equal_to, limit, *, scored=False):
        if scored:
            return StoreSQL.store_rows_under(self, prefix, now, equal_to, limit, scored=True)
        sql, params = self.store_under_sql(prefix, now, equal_to, limit)
        return _sqlite_rows(sql.replace("%s", "?"), params)

    def store_rows_by_key(self, pairs, now):
        if len(pairs) != 1:
            return StoreSQL.store_rows_by_key(self, pairs, now)
        when = now.astimezone(UTC).replace(tzinfo=None).isoformat(" ")
        return _sqlite_rows(_SQLITE_BY_KEY, (*pairs[0], when))


def _sqlite_rows(sql, params):
    """STORE_NAMES rows of a statement run on the DB-API connection, converted as the ORM would."""
    conn = connections[DEFAULT_DB_ALIAS]
    conn.ensure_connection()
    rows = conn.connection.execute(sql, params).fetchall()
    return [
        [pk, ns, key, json.loads(value), _aware(created), _aware(updated), ttl, _aware(expires)]
        for pk, ns, key, value, created, updated, ttl, expires in rows
    ]


_SQLITE_BY_KEY = f'{_SELECT} WHERE s.namespace = ? AND s."key" = ? AND (s.expires_at IS NULL OR s.expires_at > ?)'


def _aware(value):
    """A stored UTC datetime, aware (the driver may already have parsed the column's text)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC)
