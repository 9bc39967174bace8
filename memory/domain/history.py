"""Fact history: every state a fact has had, and reads of what was true at a time.

Internal to the memory service. As in SQL:2011 system-versioned tables, a fact's current state is
its own row, with how it came to be (Fact.change_action, and the writer when not the value's own);
a change first copies the state it replaces into a FactVersion row (`supersede`), in the change's
own transaction, and a delete adds a `deleted` version after it (`record_deleted`). A create
writes no version. FactHistory (a database view) reads both as one history: a version holds the
fact as it was from `valid_from` until the next version of the same owner and key; a `deleted`
one ends it. `MemoryService.get_fact(..., as_of=)`, `search_facts(..., as_of=)` and
`fact_history()` read it. MEMORY["FACT_HISTORY"] = False stops keeping superseded states (and the
point-in-time reads refuse, since they would answer from a partial record).

Valid time (when a value holds in the world: Fact.valid_from / valid_to) rides along: a version
keeps its fact's as world_from / world_to. An update closes the value it replaces: the copy's
world_to becomes the new value's start (recorded_world_to keeps the end it had, for reads as of
before the change), so one row per owner and key still holds the current value and history the
closed ones. `version_at` / `versions_at` / `states_of` read both at a world time (`valid_at`) as
recorded at a time (`as_of`): per owner and key, the latest recorded state whose valid time contains it.

Versions are copied from their fact's row in the database (never read into Python): set_fact's
by the same statement as its write on PostgreSQL (a CTE), by the statement before it on SQLite
(the backends' update_fact with supersede=True).
"""

from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone

from ..backends.base import FACT_TABLE, SUPERSEDE_FROM, VERSION_TABLE, owner_terms, version_copy_sql
from ..backends.rows import fetch_models, select_columns
from ..conf import memory_settings
from ..models import FACT_HISTORY_VIEW, SCOPE_RANK, FactAction, FactHistory
from ..models.owners import owners_condition
from ..models.workspaces import current_workspace_id
from ..rules.validation import chunks
from ..text import fact_search_text

_VALID_FROM = FactHistory._meta.get_field("valid_from")


def enabled():
    return bool(memory_settings.FACT_HISTORY)


def change_columns(action, writer=None):
    """The Fact columns that say how its new state came to be: `action`, by `writer` (anything with
    `source_episode_id` and `provenance`) when that is not the value's own writer (a confirmation, a
    refused write, a merge), else None."""
    return {
        "change_action": action,
        "change_source_episode_id": None if writer is None else writer.source_episode_id,
        "change_provenance": None if writer is None else writer.provenance,
    }


def _in_chunks(cursor, sql, params, ids):
    """Run `sql` + "IN (ids)" once per chunk of ids; returns the rows written."""
    written = 0
    for chunk in chunks(sorted(set(ids))):
        cursor.execute(f"{sql} ({', '.join(['%s'] * len(chunk))})", [*params, *chunk])
        written += max(cursor.rowcount, 0)
    return written


def supersede(fact_ids):
    """Keep the current state of each of these facts as a version, before a change replaces it.

    One INSERT ... SELECT per chunk of ids; call inside the changing transaction. Returns the versions written.
    """
    if not memory_settings.FACT_HISTORY or not fact_ids:
        return 0
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        return _in_chunks(cursor, f"{SUPERSEDE_FROM}f.id IN", [], fact_ids)


def record_deleted(fact_ids, when=None, *, provenance=None):
    """Keep the last state of each of these facts and a `deleted` version after it, before they are deleted.

    `provenance`: who deleted them ("deleted by admin:<username>"); None keeps each fact's own.
    Two INSERT ... SELECT per chunk of ids; call inside the deleting transaction. Returns the
    `deleted` versions written.
    """
    if not memory_settings.FACT_HISTORY or not fact_ids:
        return 0
    conn = connections[DEFAULT_DB_ALIAS]
    stamp = _VALID_FROM.get_db_prep_save(when or timezone.now(), conn)
    ended = version_copy_sql(
        "f",
        action="%s",
        valid_from="%s",
        episode="f.source_episode_id",
        provenance="f.provenance" if provenance is None else "%s",
    )
    params = [FactAction.DELETED, *([] if provenance is None else [provenance]), stamp]
    with conn.cursor() as cursor:
        _in_chunks(cursor, f"{SUPERSEDE_FROM}f.id IN", [], fact_ids)
        return _in_chunks(cursor, f"{ended}{FACT_TABLE} f WHERE f.id IN", params, fact_ids)


def adopt_current_versions(fact_ids):
    """Facts imported with their current state among their versions (an export from before the
    current state lived on the fact row): each takes its latest version's action, writer and start,
    and that version row goes. Only a version valid from the fact's last update on can be its
    current state; a file of the current format has none. Returns the facts adopted."""
    latest = f"SELECT {{}} FROM {VERSION_TABLE} q WHERE q.fact_id = f.id ORDER BY q.valid_from DESC, q.id DESC LIMIT 1"
    found = {}
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        for chunk in chunks(sorted(set(fact_ids))):
            cursor.execute(
                f"SELECT f.id, v.id FROM {FACT_TABLE} f JOIN {VERSION_TABLE} v ON v.id = ({latest.format('q.id')}) "
                f"WHERE f.id IN ({', '.join(['%s'] * len(chunk))}) AND v.action <> %s AND v.valid_from >= f.updated_at",
                [*chunk, FactAction.DELETED],
            )
            found.update(cursor.fetchall())
        if not found:
            return 0
        sets = ", ".join(
            f"{column} = ({latest.format(source)})"
            for column, source in (
                ("change_action", "q.action"),
                ("change_source_episode_id", "q.source_episode_id"),
                ("change_provenance", "q.provenance"),
                ("updated_at", "q.valid_from"),
            )
        )
        _in_chunks(cursor, f"UPDATE {FACT_TABLE} AS f SET {sets} WHERE f.id IN", [], found)
        _in_chunks(cursor, f"DELETE FROM {VERSION_TABLE} WHERE id IN", [], found.values())
    return len(found)


# ---------------------------------------------------------------- point-in-time reads

_ORDER = "valid_from DESC, id DESC"  # the later version wins; of one instant, the later written


def _rank(version):
    return SCOPE_RANK[version.scope]


def _states_at(viewer, valid_at, as_of=None, keys=None):
    """Per (owner, key) the viewer sees, the state that held at `valid_at` (world time) as recorded
    by `as_of` (recorded time; None: as recorded now). One query.

    The state is the latest recorded version (at `as_of`) whose valid time contains `valid_at`: a
    later value that closed an earlier one holds from its start on, the earlier one before it; a
    correction recorded later wins over what it corrected. A version's end is the one it has now
    (world_to, closed by the value that replaced it), or, read as of a time before it was
    replaced, the one it had then (recorded_world_to). A `deleted` version recorded after a state
    ends it: a fact deleted since holds nothing, at any time. Inside a workspace, only its versions
    are read, and a version is ended only by a `deleted` one of its own workspace.
    """
    conn = connections[DEFAULT_DB_ALIAS]
    owners, params = owners_condition("v.scope_key", owner_terms(viewer))
    world = _VALID_FROM.get_db_prep_value(valid_at, conn)
    recorded = None if as_of is None else _VALID_FROM.get_db_prep_value(as_of, conn)
    inner = [owners]
    workspace_id = current_workspace_id()
    if workspace_id is not None:
        # Owner keys but a person's are the same text in every workspace: another workspace's
        # versions under them must not take the place (ROW_NUMBER below) of the current one's.
        inner.append("v.workspace_id = %s")
        params.append(workspace_id)
    if keys is not None:
        inner.append(f'v."key" IN ({", ".join(["%s"] * len(keys))})')
        params += list(keys)
    if recorded is not None:
        inner.append("v.valid_from <= %s")
        params.append(recorded)
    # Read as of a time, a version not yet replaced then (no later version by then) had the end it was recorded with.
    replaced = "LEAD(v.valid_from) OVER (PARTITION BY v.fact_id ORDER BY v.valid_from, v.id)"
    end = (
        "s.world_to"
        if recorded is None
        else "CASE WHEN s.replaced_at IS NULL THEN s.recorded_world_to ELSE s.world_to END"
    )
    ended = (
        f'SELECT 1 FROM {VERSION_TABLE} d WHERE d.scope_key = s.scope_key AND d."key" = s."key" '
        "AND d.workspace_id = s.workspace_id AND d.action = %s "
        "AND (d.valid_from > s.valid_from OR d.valid_from = s.valid_from AND s.id > 0 AND d.id > s.id)"
        + ("" if recorded is None else " AND d.valid_from <= %s")
    )
    params += [FactAction.DELETED, world, world, FactAction.DELETED, *([] if recorded is None else [recorded])]
    columns = select_columns(FactHistory, "s")
    sql = (
        f"SELECT {select_columns(FactHistory, 't')} FROM (SELECT {columns}, ROW_NUMBER() OVER "
        f'(PARTITION BY s.workspace_id, s.scope_key, s."key" ORDER BY s.{_ORDER.replace(", ", ", s.")}) AS position FROM '
        f"(SELECT {select_columns(FactHistory, 'v')}, {replaced} AS replaced_at FROM {FACT_HISTORY_VIEW} v "
        f"WHERE {' AND '.join(inner)}) s "
        f"WHERE s.action <> %s AND (s.world_from IS NULL OR s.world_from <= %s) AND ({end} IS NULL OR {end} > %s) "
        f"AND NOT EXISTS ({ended})) t WHERE t.position = 1"
    )
    return fetch_models(FactHistory, sql, params)


def _most_specific(states):
    best = {}
    for version in states:
        held = best.get(version.key)
        if held is None or _rank(version) < _rank(held):
            best[version.key] = version
    return best


def version_at(key, viewer, *, valid_at, as_of=None):
    """The most specific state of `key` among the viewer's owners that held at `valid_at` as
    recorded by `as_of` (see _states_at), or None. One query. An owner whose fact did not hold
    then lets a less specific owner's answer, as a current read does when it has no fact."""
    return _most_specific(_states_at(viewer, valid_at, as_of, keys=[key])).get(key)


def versions_at(viewer, *, valid_at, as_of=None, tokens=(), min_confidence=None, fact_type=None, limit=None):
    """The states that held at `valid_at` as recorded by `as_of` (see _states_at) that the viewer
    saw, matching as search_facts matches, most confident first (then the more specific, then the
    newer). One query; shadowing (a more specific owner's state with the same key hides the
    others), the words, confidence and type are applied in Python: an audit, not a hot path."""
    found = []
    for version in _most_specific(_states_at(viewer, valid_at, as_of)).values():
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


def states_of(viewer, keys, *, valid_at, as_of=None):
    """{(owner key, key): state} for these keys among the viewer's owners (see _states_at); recall
    swaps each fact it found for its state then."""
    if not keys:
        return {}
    return {(v.scope_key, v.key): v for v in _states_at(viewer, valid_at, as_of, keys=sorted(set(keys)))}


def versions_of(fact_id=None, *, scope_key=None, key=None, limit=None):
    """A fact's versions (or every version of an owner's key, across facts deleted and written
    again), oldest first; with `limit`, the latest `limit` of them."""
    qs = FactHistory.objects.all()
    if fact_id is not None:
        qs = qs.filter(fact_id=fact_id)
    if scope_key is not None:
        qs = qs.filter(scope_key=scope_key, key=key)
    if limit is None:
        return list(qs.order_by("valid_from", "id"))
    return list(reversed(qs.order_by("-valid_from", "-id")[:limit]))
