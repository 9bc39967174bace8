"""Hand-written statements for the hot paths that skip queryset compiling (it took longer than running them).

SELECTs come back with the ORM's value conversions; counters are bumped in one UPDATE per distinct step.
"""

import json
from collections import defaultdict
from functools import cache, cached_property, lru_cache

from django.db import DEFAULT_DB_ALIAS, connections, models
from django.utils import timezone

from ..models.workspaces import current_workspace_id


class Columns:
    """The model fields a hand-written SELECT returns, one per column, with the value converters the
    ORM would apply (JSON decoding, datetimes on SQLite), worked out once per database vendor."""

    def __init__(self, fields):
        self.fields = tuple(fields)
        self.attnames = [f.attname for f in self.fields]
        self._converters = {}

    def converters(self, conn):
        found = self._converters.get(conn.vendor)
        if found is None:
            found = []
            for i, field in enumerate(self.fields):
                col = field.get_col(field.model._meta.db_table)
                funcs = [
                    _load_json if f == getattr(field, "from_db_value", None) and _plain_json(field) else f
                    for f in conn.ops.get_db_converters(col) + field.get_db_converters(conn)
                ]
                if funcs:
                    found.append((i, col, funcs))
            self._converters[conn.vendor] = found
        return found


def _plain_json(field):
    """A JSONField decoded as Django's own JSONField decodes it (no custom decoder or override)."""
    return (
        isinstance(field, models.JSONField)
        and field.decoder is None
        and type(field).from_db_value is models.JSONField.from_db_value
    )


def _load_json(value, expression, connection):
    """JSONField.from_db_value for a whole column (what a SELECT of select_columns returns): the
    same decoding without its checks for key lookups, and the empty list (most facts' tags) without
    the parser: a fact row has two JSON columns, read on every get."""
    if value == "[]":
        return []
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


@cache
def model_columns(model):
    """Columns of every concrete field of `model`, in field order (what select_columns selects)."""
    return Columns(model._meta.concrete_fields)


@lru_cache(maxsize=512)
def _by_name(sql):
    """`sql` with its positional parameters (%s) named (%(p0)s, %(p1)s ...), and their names in order.

    As Django reads `sql` (%% a literal %, a lone % kept as it is), for Python's % formatting.
    """
    names, out = [], []
    for n, part in enumerate(sql.split("%%")):
        if n:
            out.append("%%")
        for i, piece in enumerate(part.split("%s")):
            if i:
                names.append(f"p{len(names)}")
                out.append(f"%({names[-1]})s")
            out.append(piece.replace("%", "%%"))
    return "".join(out), tuple(names)


def execute(cursor, sql, params):
    """cursor.execute(sql, params), the parameters passed by name on SQLite.

    Django's SQLite cursor turns a statement's %s into ? with a regular expression run over the
    whole statement on every call (about 170 instructions a character: more than SQLite takes to
    run a get_fact); for named parameters it uses Python's % formatting, a plain scan.
    """
    if cursor.db.vendor != "sqlite" or not params:
        return cursor.execute(sql, params)
    named, names = _by_name(sql)
    if len(names) != len(params):  # the driver's own error names the mismatch
        return cursor.execute(sql, params)
    return cursor.execute(named, dict(zip(names, params)))


def fetch_rows(sql, params, columns):
    """Run a hand-written SELECT; each row as a list of values converted as the ORM would (`columns`: a Columns)."""
    conn = connections[DEFAULT_DB_ALIAS]
    with conn.cursor() as cursor:
        execute(cursor, sql, params)
        rows = cursor.fetchall()
    converters = columns.converters(conn)
    result = []
    for row in rows:
        values = list(row)
        for i, col, funcs in converters:
            # NULL stays None through every converter Django and these models have; skipping them
            # matters now that a fact row has several columns that are mostly NULL (valid time).
            if values[i] is None:
                continue
            for func in funcs:
                values[i] = func(values[i], col, conn)
        result.append(values)
    return result


@cache
def select_columns(model, alias):
    """Every column of `model` in field order, for a SELECT that fetch_models turns into instances.

    (SQLite datetimes are converted by Django's own converters: a one-step ISO parser of our own
    gained nothing in bench.facts.)
    """
    return ", ".join(f'{alias}."{field.column}"' for field in model._meta.concrete_fields)


def fetch_models(model, sql, params):
    """Instances of `model` from a hand-written SELECT of select_columns(model, ...), built by Model.from_db.

    from_db is Django's public way to build loaded instances; building them by hand (skipping
    Model.__init__) gained nothing on bench.facts' gets and would bypass what Django sets up.
    """
    columns = model_columns(model)
    items = [model.from_db(DEFAULT_DB_ALIAS, columns.attnames, values) for values in fetch_rows(sql, params, columns)]
    workspace_id = current_workspace_id()
    if workspace_id is not None and _in_workspaces(model):
        # A safety net: the hot reads hold the workspace in their SQL (base.in_workspace_sql), and
        # this is one comparison per row returned, for any statement that does not.
        items = [item for item in items if item.workspace_id == workspace_id]
    return items


@cache
def _in_workspaces(model):
    return any(field.name == "workspace" for field in model._meta.concrete_fields)


def models_by_id(model, ids):
    """{id: instance} of `model` for these ids (like QuerySet.in_bulk, without compiling a queryset)."""
    ids = list(ids)
    if not ids:
        return {}
    sql = (
        f"SELECT {select_columns(model, 't')} FROM {model._meta.db_table} t "
        f"WHERE t.id IN ({', '.join(['%s'] * len(ids))})"
    )
    return {item.pk: item for item in fetch_models(model, sql, ids)}


def held_rows(model, ids, *, lock="UPDATE"):
    """The ids of `model` rows among `ids` that exist, locked for the rest of the transaction.

    PostgreSQL: FOR `lock` (UPDATE, KEY SHARE, ...) SKIP LOCKED, in id order, so a background writer
    (the embedding worker) takes what it can at once and never waits behind a transaction that holds
    a row, such as a delete of those rows that may wait in turn for one the writer already holds (a
    deadlock). SQLite has no row locks: a write transaction holds the whole database, so every
    existing row is held. Call inside a transaction.
    """
    ids = sorted(set(ids))
    if not ids:
        return set()
    conn = connections[DEFAULT_DB_ALIAS]
    sql = f"SELECT id FROM {model._meta.db_table} WHERE id IN ({', '.join(['%s'] * len(ids))}) ORDER BY id"
    if conn.features.has_select_for_update_skip_locked:
        sql += f" FOR {lock} SKIP LOCKED"
    with conn.cursor() as cursor:
        cursor.execute(sql, ids)
        return {row[0] for row in cursor.fetchall()}


_CHUNK = 2000  # ids per statement: SQLite allows 32,766 parameters, PostgreSQL 65,535


def bump_counters(model, counts, count_field, time_field, when):
    """Add each id's count in `counts` ({id: n}) to `count_field` and set `time_field` to `when`.

    One UPDATE per distinct n (and per chunk of ids); returns how many rows were updated.
    """
    conn = connections[DEFAULT_DB_ALIAS]
    count_column = model._meta.get_field(count_field).column
    time = model._meta.get_field(time_field)
    stamp = time.get_db_prep_save(when, conn)
    by_count = defaultdict(list)
    for pk, n in counts.items():
        by_count[n].append(pk)
    updated = 0
    with conn.cursor() as cursor:
        for n, ids in by_count.items():
            for start in range(0, len(ids), _CHUNK):
                chunk = ids[start : start + _CHUNK]
                cursor.execute(
                    f'UPDATE {model._meta.db_table} SET "{count_column}" = "{count_column}" + %s, "{time.column}" = %s '
                    f"WHERE id IN ({', '.join(['%s'] * len(chunk))})",
                    [n, stamp, *chunk],
                )
                updated += cursor.rowcount
    return updated


_PLAIN, _NOW, _CONVERT = object(), object(), object()


def _insert_kind(field):
    """How RowInsert turns a field's value into a parameter (Field.get_db_prep_save is the general
    path; most columns need nothing, and it is a third of a write's Python time)."""
    if isinstance(field, models.DateTimeField) and (field.auto_now or field.auto_now_add):
        return _NOW
    if isinstance(
        field, (models.CharField, models.TextField, models.FloatField, models.IntegerField, models.ForeignKey)
    ):
        return _PLAIN
    return _CONVERT


class RowInsert:
    """One model's INSERT ... RETURNING, its statement and parameter plan prepared once.

    Called with an unsaved instance: returns the RETURNING row, or None when `suffix`'s ON CONFLICT
    inserted nothing. Timestamps Django would fill in (auto_now, auto_now_add) take the insert time
    unless the instance carries one (an episode's start). Text, number and foreign key values go to
    the driver as they are: the caller has validated them. `placeholders` gives a column's value SQL
    other than "%s" (by attname, taking the value as its one parameter).
    """

    def __init__(self, model, suffix="", *, placeholders=None):
        self.table = model._meta.db_table
        self.fields = [f for f in model._meta.concrete_fields if not (f.primary_key or f.generated)]
        self.plan = [(f, _insert_kind(f)) for f in self.fields]
        self.suffix = suffix
        self.placeholders = placeholders or {}

    @cached_property
    def sql(self):
        columns = ", ".join('"' + f.column + '"' for f in self.fields)
        values = ", ".join(self.placeholders.get(f.attname, "%s") for f in self.fields)
        return f"INSERT INTO {self.table} ({columns}) VALUES ({values}) {self.suffix}"

    def __call__(self, obj):
        params = self.params(obj)
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            execute(cursor, self.sql, params)
            return cursor.fetchone()

    def params(self, obj):
        """The statement's parameters for `obj` (filling in its timestamps), in the order of `sql`."""
        conn = connections[DEFAULT_DB_ALIAS]
        now = now_db = None
        params = []
        for field, kind in self.plan:
            value = getattr(obj, field.attname)
            if kind is _PLAIN:  # validated str/int/float/None: the driver takes it as it is
                params.append(value)
            elif kind is _NOW and value is None:  # one timestamp for all of them, converted once
                if now is None:
                    now = timezone.now()
                    now_db = field.get_db_prep_save(now, conn)
                setattr(obj, field.attname, now)
                params.append(now_db)
            elif value is None:  # NULL is NULL to every field (valid time, last access, ...)
                params.append(None)
            else:
                params.append(field.get_db_prep_save(value, conn))
        return params


def fetch_in_chunks(sql, params, size):
    """The rows of one SELECT, `size` at a time, with binary columns (bytea) as raw bytes.

    On PostgreSQL through a psycopg cursor of its own that asks for binary results: Django's cursor
    reads them as text, where a stored vector travels and is decoded as hex, twice its size (loading
    100,000 vectors: 1.8 s that way, 0.5 s this way). That cursor bypasses Django's execute wrappers;
    its errors are Django's all the same (wrap_database_errors), as callers catch those.
    """
    conn = connections[DEFAULT_DB_ALIAS]
    if conn.vendor != "postgresql":
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
            while rows := cursor.fetchmany(size):
                yield rows
        return
    import psycopg

    conn.ensure_connection()
    with conn.wrap_database_errors, psycopg.Cursor(conn.connection) as cursor:
        cursor.execute(sql, params, binary=True)
        while rows := cursor.fetchmany(size):
            yield rows
