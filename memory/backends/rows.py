"""Hand-written SELECTs with the ORM's value conversions, for the hot paths that skip queryset compiling."""
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
