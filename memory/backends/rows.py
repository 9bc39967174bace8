"""Hand-written statements for the hot paths that skip queryset compiling (it took longer than running them).

SELECTs come back with the ORM's value conversions; counters are bumped in one UPDATE per distinct step.
"""
from collections import defaultdict
from functools import lru_cache

from django.db import DEFAULT_DB_ALIAS, connection, connections


@lru_cache(maxsize=None)
def _converters(vendor, fields):
    """Per column, the functions Django applies to a raw value (JSON decoding, datetimes on SQLite)."""
    result = []
    for i, field in enumerate(fields):
        col = field.get_col(field.model._meta.db_table)
        funcs = connection.ops.get_db_converters(col) + field.get_db_converters(connection)
        if funcs:
            result.append((i, col, funcs))
    return result


def fetch_rows(sql, params, fields):
    """Run a hand-written SELECT; each row as a list of values converted as the ORM would for `fields`
    (a tuple of model fields, one per selected column)."""
    conn = connections[DEFAULT_DB_ALIAS]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    converters = _converters(conn.vendor, fields)
    result = []
    for row in rows:
        values = list(row)
        for i, col, funcs in converters:
            for func in funcs:
                values[i] = func(values[i], col, conn)
        result.append(values)
    return result


@lru_cache(maxsize=None)
def select_columns(model, alias):
    """Every column of `model` in field order, for a SELECT that fetch_models turns into instances."""
    return ", ".join(f'{alias}."{f.column}"' for f in model._meta.concrete_fields)


def fetch_models(model, sql, params):
    """Instances of `model` from a hand-written SELECT of select_columns(model, ...)."""
    fields = tuple(model._meta.concrete_fields)
    attnames = [f.attname for f in fields]
    return [model.from_db(DEFAULT_DB_ALIAS, attnames, values) for values in fetch_rows(sql, params, fields)]


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
