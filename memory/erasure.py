"""Forgetting a person, provably: what goes with them, the scrubbing after commit, and the checks.

`MemoryService.delete_users(cascade=True)` deletes a person's rows; this module deletes everything
else that names them, in the same transaction (their recall events, admin log entries, the keyword
indexes' pending deltas and merged segments), then, after the commit, takes the words out of the
database files (SQLite: the WAL truncated; every connection runs with `secure_delete`, so deleted
content is overwritten in the pages themselves). Apps that keep per-person data elsewhere (threads and
checkpoints) do their part through the `users_deleting` signal and register what to scan through
`trace_scanners`.

`find_traces(needles, user_ids)` is what `memory verify-erasure` runs: every table, every text column,
the user id in every owner column, and on SQLite the raw bytes of the database files and their WAL.

PostgreSQL: the rows are deleted in the same transaction, but a deleted row's bytes stay in its
table's pages until VACUUM reclaims them (autovacuum does, later), and in WAL segments, replicas and
backups until those rotate out. `memory verify-erasure` there checks what SQL can see.
"""

import logging
from pathlib import Path

from django.db import connection, transaction

from .filebytes import count_in_files
from .models import (
    ChannelIdentity,
    Episode,
    Fact,
    FactHistory,
    MemoryUser,
    RecallEvent,
    RecallKind,
    RecallScope,
    Scope,
    StoreItem,
)
from .owners import owner_key
from .validation import chunks

logger = logging.getLogger("engram.memory")

# Other apps' scanners: callables (needles, user_ids) -> [(where, what)] of traces they keep.
trace_scanners = []


def erase_related(user_ids, fact_ids, episode_ids):
    """Inside the delete transaction, before the rows go: recall events and admin log entries naming them."""
    from django.contrib.admin.models import LogEntry
    from django.contrib.contenttypes.models import ContentType

    from .recall_events import recall_log

    recall_log.forget(user_ids, {RecallKind.FACT: fact_ids, RecallKind.EPISODE: episode_ids})
    removed = 0
    for chunk in chunks(sorted(user_ids)):
        removed += RecallEvent.objects.filter(user_id__in=chunk).delete()[0]
    for kind, ids in ((RecallKind.FACT, fact_ids), (RecallKind.EPISODE, episode_ids)):
        for chunk in chunks(sorted(ids)):
            removed += RecallEvent.objects.filter(kind=kind, item_id__in=chunk).delete()[0]
    identity_ids = list(ChannelIdentity.objects.filter(user_id__in=list(user_ids)).values_list("pk", flat=True))
    for model, ids in (
        (MemoryUser, user_ids),
        (Fact, fact_ids),
        (Episode, episode_ids),
        (ChannelIdentity, identity_ids),
    ):
        content_type = ContentType.objects.get_for_model(model)
        for chunk in chunks(sorted(ids)):
            LogEntry.objects.filter(content_type=content_type, object_id__in=[str(i) for i in chunk]).delete()
    return removed


def purge_indexes(backend, user_ids):
    """After the rows are deleted, still inside the transaction: no index keeps their words (SQLite FTS5
    keeps a deleted entry's tokens in its segments until they are merged, and its deltas hold text),
    and no vector-index counter keeps their owner key."""
    from django.db.models import Q

    backend.optimize()
    backend.optimize_recall_index()
    for chunk in chunks(sorted(user_ids)):
        owners = Q(owner__in=[owner_key(Scope.USER, user_id=u) for u in chunk])
        for u in chunk:
            owners |= Q(owner__startswith=f"{owner_key(Scope.USER, user_id=u)}/")
        RecallScope.objects.filter(owners).delete()


def scrub_after_commit():
    """Once the deletion commits: the database files let go of what the deleted rows held."""
    if connection.vendor != "sqlite":
        return

    def scrub():
        try:
            with connection.cursor() as cursor:
                cursor.execute("PRAGMA incremental_vacuum")  # freed pages back to the file system
                # Old page images out of the WAL. It waits (the busy timeout) for readers of older
                # frames; if one is still reading then, the WAL keeps its frames and busy is 1.
                cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                busy, frames, _copied = cursor.fetchone()
            if busy:
                logger.warning(
                    "erasure: a reader kept the database's WAL (%s frames) from being truncated; "
                    "memory verify-erasure shows what is left in it",
                    frames,
                )
        except Exception:  # noqa: BLE001  (the deletion stands; verify-erasure shows what is left)
            logger.exception("erasure: could not truncate the database's WAL")

    transaction.on_commit(scrub, robust=True)


# ---------------------------------------------------------------- verification


def find_traces(needles, user_ids=()):
    """[(where, what)] of every trace of these strings (case-insensitive) and memory user ids."""
    needles = [n for n in dict.fromkeys(str(n).strip() for n in needles) if len(n) >= 3]
    user_ids = sorted({int(u) for u in user_ids})
    traces = _table_traces(needles, user_ids)
    if connection.vendor == "sqlite":
        name = connection.settings_dict["NAME"]
        traces += file_traces(Path(name), needles)
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


def _column_traces(cursor, table, column, needles, user_ids):
    column_sql = connection.ops.quote_name(column.name)
    where = f"{table}.{column.name}"
    kind = _column_kind(column)
    found = []
    if kind == "text":
        text = f"CAST({column_sql} AS TEXT)"
        like = "LIKE" if connection.vendor == "sqlite" else "ILIKE"
        for needle in needles:
            n = _count(cursor, table, f"{text} {like} %s", [f"%{needle}%"])
            if n:
                found.append((where, f"{n} row(s) contain {needle!r}"))
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


def file_traces(path, needles):
    """Traces of the needles (case-insensitive) in a SQLite file and its WAL, read as raw bytes (by a
    child process: see memory/filebytes.py for why this one must not open the files itself)."""
    files = [Path(path), Path(f"{path}-wal")]
    counts = count_in_files(files, needles)
    traces = []
    for candidate in files:
        for needle, hits in counts.get(str(candidate), {}).items():
            if hits:
                traces.append((str(candidate.name), f"{hits} occurrence(s) of {needle!r} in the file's bytes"))
    return traces


# ---------------------------------------------------------------- subject access


def export_person(user, out):
    """JSON Lines of everything held about `user` (a surviving memory user); returns the lines written."""
    import json

    from django.core.serializers.json import DjangoJSONEncoder
    from django.forms.models import model_to_dict

    from .signals import person_exporting

    merged = list(MemoryUser.objects.filter(merged_into=user).order_by("pk"))
    user_ids = [user.pk, *(u.pk for u in merged)]
    lines = 0

    def write(kind, row):
        nonlocal lines
        out.write(
            json.dumps({"kind": kind, **row}, cls=DjangoJSONEncoder, ensure_ascii=False) + "\n"
        )  # row has no "kind"
        lines += 1

    for person in [user, *merged]:
        write("memory_user", {**model_to_dict(person), "created_at": person.created_at, "last_seen": person.last_seen})
    for identity in ChannelIdentity.objects.filter(user_id__in=user_ids).order_by("pk"):
        write(
            "identity",
            {"channel": identity.channel, "external_id": identity.external_id, "created_at": identity.created_at},
        )
    for fact in Fact.objects.filter(user_id__in=user_ids).order_by("pk"):
        write(
            "fact",
            {
                **model_to_dict(fact, exclude=["search_text"]),
                "created_at": fact.created_at,
                "updated_at": fact.updated_at,
            },
        )
    for version in FactHistory.objects.filter(user_id__in=user_ids).order_by("valid_from", "id"):
        write("fact_version", {**model_to_dict(version), "valid_from": version.valid_from})
    for episode in Episode.objects.filter(user_id__in=user_ids).order_by("pk"):
        write("episode", {**model_to_dict(episode), "started_at": episode.started_at, "ended_at": episode.ended_at})
    for event in RecallEvent.objects.filter(user_id__in=user_ids).order_by("pk"):
        row = model_to_dict(event)
        row["item_kind"] = row.pop("kind")
        write("recall_event", {**row, "created_at": event.created_at})
    for item in StoreItem.objects.filter(user_id__in=user_ids).order_by("pk"):
        write(
            "store_item",
            {
                "namespace": item.namespace.split("."),
                "key": item.key,
                "value": item.value,
                "created_at": item.created_at,
                "updated_at": item.updated_at,
            },
        )
    for _, rows in person_exporting.send(sender=MemoryUser, user_ids=user_ids):
        for row in rows or []:
            write(row.pop("kind", "other"), row)
    return lines
