"""What `memory verify-erasure` runs: every place a forgotten person's identifiers could still be read.

`find_traces(needles, user_ids)` returns [(where, what)] of every trace, case-insensitive:

- every table's every text, JSON and binary column, each needle searched as written AND as a JSON
  encoder writes it by default (`\\u0141ucja` for "Łucja": Django's JSONField escapes non-ASCII on SQLite);
  owner keys (`user:<id>`) in text columns and the ids in `user_id` columns;
- PostgreSQL's planner statistics (`pg_stats`: most common values and histogram bounds of every column of
  the schema, the checkpoint tables included; bytea values are matched by their hex form), which ANALYZE
  copies from the rows and which stay until the next ANALYZE of that table;
- `django_session`, decoded: the admin keeps each tab's search and filters there (URL-encoded);
- SQLite: the raw bytes of the database file, its `-wal`, `-shm` and `-journal`, read by a child process
  (memory/operations/filebytes.py), needles in UTF-8 and JSON-escaped.

Apps add their own places with `trace_scanners.append(scan)`, `scan(needles, user_ids) -> [(where, what)]`
(workflows: checkpoint threads of the user ids, and the SQLite checkpoint file's bytes).
"""

import json
from pathlib import Path
from urllib.parse import unquote_plus

from django.db import connection

from ..models import Scope
from ..models.owners import owner_key
from .filebytes import count_in_files

# Other apps' scanners: callables (needles, user_ids) -> [(where, what)] of traces they keep.
trace_scanners = []

MIN_NEEDLE = 3  # shorter strings match everywhere


def needle_forms(needle):
    """The needle and its JSON-escaped form (the same string when it is plain ASCII)."""
    escaped = json.dumps(needle)[1:-1]
    return [needle] if escaped == needle else [needle, escaped]


def clean_needles(needles):
    return [n for n in dict.fromkeys(str(n).strip() for n in needles) if len(n) >= MIN_NEEDLE]


def find_traces(needles, user_ids=()):
    """[(where, what)] of every trace of these strings (case-insensitive) and memory user ids."""
    needles = clean_needles(needles)
    user_ids = sorted({int(u) for u in user_ids})
    traces = _table_traces(needles, user_ids)
    traces += session_traces(needles)
    if connection.vendor == "postgresql":
        traces += statistics_traces(needles, user_ids)
    if connection.vendor == "sqlite":
        traces += file_traces(Path(connection.settings_dict["NAME"]), needles)
    for scan in trace_scanners:
        traces += scan(needles, user_ids)
    return traces


def _table_traces(needles, user_ids):
    traces = []
    introspection = connection.introspection
    with connection.cursor() as cursor:
        for table in introspection.table_names(cursor):
            try:
                columns = introspection.get_table_description(cursor, table)
            except Exception:  # noqa: BLE001  (virtual tables without a description: their shadows are scanned)
                continue
            for column in columns:
                traces += _column_traces(cursor, table, column, needles, user_ids)
    return traces


def _column_kind(column):
    """ "text", "bytes", "int" or "" for a column of the table description."""
    if connection.vendor == "sqlite":
        declared = str(column.type_code or "").lower()
        if "int" in declared:
            return "int"
        return "text" if declared == "" or any(t in declared for t in ("char", "text", "clob", "json", "blob")) else ""
    try:
        field = connection.introspection.get_field_type(column.type_code, column)
    except KeyError:  # a type Django does not map (tsvector, ...): not stored text
        return ""
    if field in ("CharField", "TextField", "JSONField"):
        return "text"
    if field == "BinaryField":
        return "bytes"
    return "int" if field.endswith(("IntegerField", "AutoField")) else ""


def _count(cursor, table, condition, params):
    cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)} WHERE {condition}", params)
    return cursor.fetchone()[0]


def _contains(text_sql):
    """SQL that is true when `text_sql` holds the parameter, case-insensitively, with no pattern
    characters (a needle's `_`, `%` or `\\`, as in a JSON escape, is matched as written)."""
    return (
        f"instr(lower({text_sql}), lower(%s)) > 0"
        if connection.vendor == "sqlite"
        else (f"strpos(lower({text_sql}), lower(%s)) > 0")
    )


def _column_traces(cursor, table, column, needles, user_ids):
    column_sql = connection.ops.quote_name(column.name)
    where = f"{table}.{column.name}"
    kind = _column_kind(column)
    found = []
    if kind == "text":
        text = f"CAST({column_sql} AS TEXT)"
        for needle in needles:
            for form in needle_forms(needle):
                n = _count(cursor, table, _contains(text), [form])
                if n:
                    found.append((where, f"{n} row(s) contain {form!r}"))
        for user_id in user_ids:  # owner keys: user:<id> exactly, or user:<id>/agent:<id>
            n = _count(
                cursor,
                table,
                f"{text} = %s OR {text} LIKE %s",
                [owner_key(Scope.USER, user_id=user_id), f"{owner_key(Scope.USER, user_id=user_id)}/%"],
            )
            if n:
                found.append((where, f"{n} row(s) owned by user:{user_id}"))
    elif kind == "bytes":
        for needle in needles:
            n = _count(cursor, table, f"position(convert_to(%s, 'UTF8') IN {column_sql}) > 0", [needle])
            if n:
                found.append((where, f"{n} row(s) hold the bytes of {needle!r}"))
    elif kind == "int" and user_ids and (column.name == "user_id" or column.name.endswith("_user_id")):
        n = _count(cursor, table, f"{column_sql} IN ({', '.join(['%s'] * len(user_ids))})", user_ids)
        if n:
            found.append((where, f"{n} row(s) with one of the user ids"))
    return found


def statistics_traces(needles, user_ids=()):
    """PostgreSQL: the needles in `pg_stats` of the schema's tables, and the user ids in the statistics
    of `user_id` columns. Each trace is named `pg_stats <table>.<column>`."""
    wanted = {form.lower() for n in needles for form in needle_forms(n)}
    # bytea statistics print as hex: match the needle's bytes, as written and in lower case.
    hexes = {n.encode("utf-8").hex() for n in needles} | {n.lower().encode("utf-8").hex() for n in needles}
    ids = {str(u) for u in user_ids}
    traces = []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tablename, attname, most_common_vals::text, histogram_bounds::text, most_common_elems::text "
            "FROM pg_stats WHERE schemaname = current_schema() ORDER BY tablename, attname"
        )
        for table, column, *values in cursor.fetchall():
            text = " ".join(v for v in values if v).lower()
            if not text:
                continue
            hits = sorted(w for w in wanted if w in text) + sorted(h for h in hexes if h in text)
            if ids and (column == "user_id" or column.endswith("_user_id")):
                elements = {e.strip('" ') for v in values if v for e in v.strip("{}").split(",")}
                hits += sorted(f"user id {i}" for i in ids & elements)
            if hits:
                traces.append((f"pg_stats {table}.{column}", f"the planner's statistics hold {', '.join(hits)}"))
    return traces


def sessions_naming(needles):
    """[(session, [keys])] of the database-backed sessions whose decoded data names a needle: the key of
    every top-level entry that does (values URL-decoded, as the admin keeps its searches)."""
    from django.conf import settings
    from django.utils.module_loading import import_string

    needles = [n.lower() for n in clean_needles(needles)]
    engine = import_string(f"{settings.SESSION_ENGINE}.SessionStore")
    if not needles or not hasattr(engine, "get_model_class"):  # cache or cookie sessions: none stored here
        return []
    found = []
    for session in engine.get_model_class().objects.iterator():
        try:
            data = session.get_decoded()
        except Exception:  # noqa: BLE001  (a session this SECRET_KEY cannot read decodes to {} anyway)
            continue
        keys = [
            key for key, value in data.items() if _names(json.dumps(value, ensure_ascii=False, default=str), needles)
        ]
        if keys:
            found.append((session, keys))
    return found


def _names(text, needles):
    decoded = unquote_plus(text).lower()  # lowered after decoding: %C5%81 is "Ł" whatever the hex case
    text = text.lower()
    return any(n in text or n in decoded for n in needles)


def session_traces(needles):
    return [
        ("django_session", f"session {session.session_key[:8]}… names them in {', '.join(map(repr, keys))}")
        for session, keys in sessions_naming(needles)
    ]


def sqlite_files(path):
    """A SQLite database file and the files beside it that can hold its pages."""
    path = Path(path)
    return [path, *(Path(f"{path}{suffix}") for suffix in ("-wal", "-shm", "-journal"))]


def file_traces(path, needles):
    """Traces of the needles (case-insensitive, as written and JSON-escaped) in a SQLite file, its WAL,
    shared-memory index and rollback journal, read as raw bytes (by a child process: see
    memory/operations/filebytes.py for why this one must not open the files itself)."""
    files = sqlite_files(path)
    forms = list(dict.fromkeys(form for n in needles for form in needle_forms(n)))
    counts = count_in_files(files, forms)
    traces = []
    for candidate in files:
        for needle, hits in counts.get(str(candidate), {}).items():
            if hits:
                traces.append((str(candidate.name), f"{hits} occurrence(s) of {needle!r} in the file's bytes"))
    return traces
