"""Fact history: a version row for every change of a fact, and reads of what was true at a time.

Internal to the memory service: writes call `record()` / `record_deleted()` inside their own
transaction; `MemoryService.get_fact(..., as_of=)`, `search_facts(..., as_of=)` and `fact_history()`
read. A version holds the fact as it was from `valid_from` until the next version of the same owner
and key; a `deleted` version ends it. MEMORY["FACT_HISTORY"] = False stops recording (and the
point-in-time reads refuse, since they would answer from a partial record).

The write path adds one INSERT per fact write, prepared once (no model instance, no queryset
compiling), and deletes add one INSERT ... SELECT per chunk of ids: the facts' last state copied in
the database, never read into Python.
"""

from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone

from .backends.base import owner_terms
from .backends.rows import fetch_models, select_columns
from .conf import memory_settings
from .models import SCOPE_RANK, Fact, FactAction, FactVersion
from .owners import fact_owner_key
from .text import fact_search_text
from .validation import chunks

VERSION_TABLE = FactVersion._meta.db_table
FACT_TABLE = Fact._meta.db_table
# The columns a version copies from its fact, in the order of both INSERTs below.
_COPIED = (
    "key",
    "value",
    "fact_type",
    "scope",
    "user_id",
    "agent_id",
    "session_id",
    "confidence",
    "source_episode_id",
    "provenance",
)
_COLUMNS = ("fact_id", "action", "scope_key", *_COPIED, "valid_from")
_COLUMN_LIST = ", ".join(f'"{c}"' for c in _COLUMNS)
_INSERT_SQL = f"INSERT INTO {VERSION_TABLE} ({_COLUMN_LIST}) VALUES ({', '.join(['%s'] * len(_COLUMNS))})"
_VALUE = FactVersion._meta.get_field("value")
_VALID_FROM = FactVersion._meta.get_field("valid_from")


def enabled():
    return bool(memory_settings.FACT_HISTORY)


def record(action, fact, when, *, writer=None):
    """One version of `fact` (as the write left it) with `action`, valid from `when`. One INSERT.

    `writer`: who made the change, when not the fact's own provenance (its `provenance` and
    `source_episode_id`): a confirmation or a refused write names its writer, not the value's first one.
    Call inside the write's transaction. Text, numbers and ids go to the driver as they are (the
    write validated them); the JSON value and the timestamp are converted as the ORM would.
    """
    if not memory_settings.FACT_HISTORY:
        return
    writer = fact if writer is None else writer
    conn = connections[DEFAULT_DB_ALIAS]
    params = [
        fact.pk,
        action,
        fact_owner_key(fact),
        fact.key,
        _VALUE.get_db_prep_save(fact.value, conn),
        fact.fact_type,
        fact.scope,
        fact.user_id,
        fact.agent_id,
        fact.session_id,
        fact.confidence,
        writer.source_episode_id,
        writer.provenance,
        _VALID_FROM.get_db_prep_save(when, conn),
    ]
    with conn.cursor() as cursor:
        cursor.execute(_INSERT_SQL, params)


def record_deleted(fact_ids, when=None, *, provenance=None):
    """A `deleted` version of each of these facts (their last state), before they are deleted.

    `provenance`: who deleted them ("deleted by admin:<username>"); None keeps each fact's own.
    One INSERT ... SELECT per chunk of ids; call inside the deleting transaction. Returns the versions written.
    """
    if not memory_settings.FACT_HISTORY:
        return 0
    ids = sorted(set(fact_ids))
    if not ids:
        return 0
    conn = connections[DEFAULT_DB_ALIAS]
    stamp = _VALID_FROM.get_db_prep_save(when or timezone.now(), conn)
    copied = ", ".join("%s" if c == "provenance" and provenance is not None else f'f."{c}"' for c in _COPIED)
    extra = [] if provenance is None else [provenance]
    written = 0
    with conn.cursor() as cursor:
        for chunk in chunks(ids):
            cursor.execute(
                f"INSERT INTO {VERSION_TABLE} ({_COLUMN_LIST}) "
                f"SELECT f.id, %s, f.scope_key, {copied}, %s FROM {FACT_TABLE} f "
                f"WHERE f.id IN ({', '.join(['%s'] * len(chunk))})",
                [FactAction.DELETED, *extra, stamp, *chunk],
            )
            written += cursor.rowcount
    return written


def backfill(fact_ids=None):
    """A `created` version (valid from the fact's last update) of each fact that has none: facts
    written outside the service (an import of a file from before history, a bulk load). One statement."""
    if not memory_settings.FACT_HISTORY:
        return 0
    copied = ", ".join(f'f."{c}"' for c in _COPIED)
    where, params = "", [FactAction.CREATED]
    if fact_ids is not None:
        ids = sorted(set(fact_ids))
        if not ids:
            return 0
        where = f"f.id IN ({', '.join(['%s'] * len(ids))}) AND "
        params += ids
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {VERSION_TABLE} ({_COLUMN_LIST}) "
            f"SELECT f.id, %s, f.scope_key, {copied}, f.updated_at FROM {FACT_TABLE} f "
            f"WHERE {where}NOT EXISTS (SELECT 1 FROM {VERSION_TABLE} v WHERE v.fact_id = f.id)",
            params,
        )
        return cursor.rowcount


# ---------------------------------------------------------------- point-in-time reads

_ORDER = "valid_from DESC, id DESC"  # the later version wins; of one instant, the later written


def _rank(version):
    return SCOPE_RANK[version.scope]


def version_as_of(key, viewer, when):
    """The most specific version in force at `when` for `key` among the viewer's owners, or None. One query.

    Per owner, the latest version of the key at `when`; a `deleted` one means that owner held no
    such fact then, so a less specific owner's answers (as a current read would).
    """
    conn = connections[DEFAULT_DB_ALIAS]
    stamp = _VALID_FROM.get_db_prep_value(when, conn)
    columns = select_columns(FactVersion, "v")
    parts, params = [], []
    for n, (owner_sql, owner_params, _) in enumerate(owner_terms(viewer)):
        parts.append(
            f"SELECT * FROM (SELECT {columns} FROM {VERSION_TABLE} v "
            f'WHERE v.scope_key = {owner_sql} AND v."key" = %s AND v.valid_from <= %s '
            f"ORDER BY v.{_ORDER.replace(', ', ', v.')} LIMIT 1) latest{n}"
        )
        params += [*owner_params, key, stamp]
    found = [v for v in fetch_models(FactVersion, " UNION ALL ".join(parts), params) if v.action != FactAction.DELETED]
    return min(found, key=_rank) if found else None


def versions_as_of(viewer, when, *, tokens=(), min_confidence=None, fact_type=None, limit=None):
    """The versions in force at `when` that the viewer saw, matching as search_facts matches, most
    confident first (then the more specific, then the newer). One query.

    The latest version of each (owner, key) at `when` is picked in the database; shadowing (a more
    specific owner's fact with the same key hides the others), the words, confidence and type are
    applied in Python to what is left: a point-in-time read is an audit, not a hot path.
    """
    conn = connections[DEFAULT_DB_ALIAS]
    terms = owner_terms(viewer)
    owners = ", ".join(sql for sql, _, _ in terms)
    params = [p for _, term_params, _ in terms for p in term_params]
    columns = select_columns(FactVersion, "v")
    sql = (
        f"SELECT {select_columns(FactVersion, 't')} FROM (SELECT {columns}, ROW_NUMBER() OVER "
        f'(PARTITION BY v.scope_key, v."key" ORDER BY v.{_ORDER.replace(", ", ", v.")}) AS position '
        f"FROM {VERSION_TABLE} v WHERE v.scope_key IN ({owners}) AND v.valid_from <= %s) t "
        f"WHERE t.position = 1 AND t.action <> %s"
    )
    params += [_VALID_FROM.get_db_prep_value(when, conn), FactAction.DELETED]
    best = {}
    for version in fetch_models(FactVersion, sql, params):
        held = best.get(version.key)
        if held is None or _rank(version) < _rank(held):
            best[version.key] = version
    found = []
    for version in best.values():
        if min_confidence and version.confidence < min_confidence:
            continue
        if fact_type and version.fact_type != fact_type:
            continue
        if tokens:
            text = fact_search_text(version.key, version.value)
            if not all(token in text for token in tokens):
                continue
        found.append(version)
    found.sort(key=lambda v: (-v.confidence, _rank(v), -v.valid_from.timestamp(), v.fact_id))
    return found[:limit] if limit is not None else found


def versions_of(fact_id=None, *, scope_key=None, key=None, limit=None):
    """A fact's versions (or every version of an owner's key, across facts deleted and written
    again), oldest first; with `limit`, the latest `limit` of them."""
    qs = FactVersion.objects.all()
    if fact_id is not None:
        qs = qs.filter(fact_id=fact_id)
    if scope_key is not None:
        qs = qs.filter(scope_key=scope_key, key=key)
    if limit is None:
        return list(qs.order_by("valid_from", "id"))
    return list(reversed(qs.order_by("-valid_from", "-id")[:limit]))
