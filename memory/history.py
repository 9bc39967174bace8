"""Fact history: a version row for every change of a fact, and reads of what was true at a time.

Internal to the memory service: writes call `record()` / `record_deleted()` inside their own
transaction; `MemoryService.get_fact(..., as_of=)`, `search_facts(..., as_of=)` and `fact_history()`
read. A version holds the fact as it was from `valid_from` until the next version of the same owner
and key; a `deleted` version ends it. MEMORY["FACT_HISTORY"] = False stops recording (and the
point-in-time reads refuse, since they would answer from a partial record).

A version copies its fact's row in the database (never read into Python): set_fact's version is
added by the same statement as its write on PostgreSQL (a CTE) and by the next one on SQLite (the
backends' update_fact / insert_fact_if_absent, given version_for()); other writes call record(),
and deletes add one INSERT ... SELECT per chunk of ids.
"""

from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone

from .backends.base import VERSION_TABLE, owner_terms, version_copy_sql
from .backends.rows import fetch_models, select_columns
from .conf import memory_settings
from .models import SCOPE_RANK, Fact, FactAction, FactVersion
from .text import fact_search_text
from .validation import chunks

FACT_TABLE = Fact._meta.db_table
_RECORD_SQL = f"{version_copy_sql('f', '%s')}{FACT_TABLE} f WHERE f.id = %s"
_VALID_FROM = FactVersion._meta.get_field("valid_from")


def enabled():
    return bool(memory_settings.FACT_HISTORY)


def version_for(action, writer):
    """What a fact write passes its backend to add its version in the same statement where it can
    (update_fact / insert_fact_if_absent): `action` by `writer` (its provenance and source episode),
    valid from the write's updated_at. None when history is off."""
    if not memory_settings.FACT_HISTORY:
        return None
    return (action, writer.source_episode_id, writer.provenance)


def record(action, fact, when, *, writer=None):
    """One version of `fact` as its row stands now, with `action`, valid from `when`. One INSERT ... SELECT.

    `writer`: who made the change, when not the fact's own provenance (its `provenance` and
    `source_episode_id`): a confirmation or a refused write names its writer, not the value's first one.
    Call inside the write's transaction, after the write. The values are copied in the database.
    """
    if not memory_settings.FACT_HISTORY:
        return
    writer = fact if writer is None else writer
    conn = connections[DEFAULT_DB_ALIAS]
    params = [action, writer.source_episode_id, writer.provenance, _VALID_FROM.get_db_prep_save(when, conn), fact.pk]
    with conn.cursor() as cursor:
        cursor.execute(_RECORD_SQL, params)


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
    copy = version_copy_sql(
        "f", "%s", episode="f.source_episode_id", provenance="f.provenance" if provenance is None else "%s"
    )
    extra = [] if provenance is None else [provenance]
    written = 0
    with conn.cursor() as cursor:
        for chunk in chunks(ids):
            cursor.execute(
                f"{copy}{FACT_TABLE} f WHERE f.id IN ({', '.join(['%s'] * len(chunk))})",
                [FactAction.DELETED, *extra, stamp, *chunk],
            )
            written += cursor.rowcount
    return written


def backfill(fact_ids=None):
    """A `created` version (valid from the fact's last update) of each fact that has none: facts
    written outside the service (an import of a file from before history, a bulk load). One statement."""
    if not memory_settings.FACT_HISTORY:
        return 0
    where, params = "", [FactAction.CREATED]
    if fact_ids is not None:
        ids = sorted(set(fact_ids))
        if not ids:
            return 0
        where = f"f.id IN ({', '.join(['%s'] * len(ids))}) AND "
        params += ids
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute(
            f"{version_copy_sql('f', 'f.updated_at', episode='f.source_episode_id', provenance='f.provenance')}"
            f"{FACT_TABLE} f WHERE {where}NOT EXISTS (SELECT 1 FROM {VERSION_TABLE} v WHERE v.fact_id = f.id)",
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
