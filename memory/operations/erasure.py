"""Forgetting a person, provably: what goes with them, the scrubbing after commit, and the registry.

`MemoryService.delete_users(cascade=True)` deletes a person's rows; this module deletes everything
else that names them, in the same transaction: their recall events, admin log entries, the keyword
indexes' pending deltas and merged segments, operators' recall queries and admin sessions that name
them (memory/operations/erasure_scan.py says what "names" means), and buffered recall events and access counts.
It also keeps a tombstone (memory/operations/tombstones.py) so an old export cannot bring them back unasked.

After the commit (`scrub_after_commit`, its result an `ErasureOutcome` on the BatchDelete):

- PostgreSQL: `ANALYZE` of every table that holds a person's data. ANALYZE copies sampled column values
  into `pg_stats` (most common values, histogram bounds), and a deleted row's values stay there until the
  table is analyzed again; a fresh sample holds only live rows. VACUUM does not refresh them by itself,
  and neither removes what the WAL segments, replicas and backups keep until those rotate out. A
  deleted row's bytes stay in its table's pages until VACUUM (autovacuum does, later) reclaims them.
- SQLite: every connection runs with `secure_delete` (deleted content is overwritten in its pages), the
  freed pages go back to the file system, and the WAL is truncated, retried while a reader holds older
  frames, for at most MEMORY["ERASURE_WAL_WAIT_SECONDS"]; if a reader still holds it then, the outcome
  says so (`complete` false, with the reason) instead of claiming success.

Apps that keep per-person data elsewhere delete it through the `users_deleting` signal and join the
rest with `register_participant(name, tables=..., scrub=..., scan=...)`: the tables to re-analyze, a
scrub to run after the commit (returns the problems it could not fix) and a scan for verify-erasure.

`memory verify-erasure` runs `find_traces` (memory/operations/erasure_scan.py).
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import transaction

from ..backends import get_backend
from ..backends.space import truncate_wal  # noqa: F401  (other apps' SQLite files use it from here)
from ..models import (
    ArchivedEpisode,
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
from ..models.owners import owner_key
from ..rules.validation import chunks
from .erasure_scan import file_traces, find_traces, sessions_naming, trace_scanners  # noqa: F401  (public here)

logger = logging.getLogger("engram.memory")

# Fact keys whose values identify a person (a name, an address): operators' queries and admin searches
# naming them go with the person, as their display name and channel ids do.
IDENTIFYING_FACT_KEYS = frozenset(
    {"name", "full_name", "first_name", "last_name", "display_name", "email", "phone", "username", "nickname"}
)


@dataclass
class ErasureOutcome:
    """What happened once a forget committed. `complete` only when every scrub ran and none failed."""

    done: bool = False
    problems: list[str] = field(default_factory=list)
    statistics_refreshed: list[str] = field(default_factory=list)

    @property
    def complete(self):
        return self.done and not self.problems

    def as_dict(self):
        return {
            "complete": self.complete,
            "pending": not self.done,
            "problems": list(self.problems),
            "statistics_refreshed": list(self.statistics_refreshed),
        }


@dataclass(frozen=True)
class ErasureParticipant:
    """An app's part in forgetting: `tables()` holding a person's data (re-analyzed on PostgreSQL), a
    `scrub()` after the commit returning the problems it could not fix, and a verify-erasure scan."""

    name: str
    tables: Callable[[], list[str]] | None = None
    scrub: Callable[[], list[str]] | None = None


participants = []


def register_participant(name, *, tables=None, scrub=None, scan=None):
    """Join forget-a-person and verify-erasure (call it from AppConfig.ready() or a module it imports)."""
    if any(p.name == name for p in participants):
        return
    participants.append(ErasureParticipant(name, tables, scrub))
    if scan is not None:
        trace_scanners.append(scan)


def person_tables():
    """Every table that may hold a person's data: the memory app's, the admin log, sessions, and the
    participants' (checkpoint tables, threads, ...)."""
    from django.apps import apps

    tables = []
    for label in ("memory", "admin", "sessions"):
        if apps.is_installed(f"django.contrib.{label}") or label == "memory":
            tables += [m._meta.db_table for m in apps.get_app_config(label).get_models() if m._meta.managed]
    for participant in participants:
        if participant.tables is not None:
            tables += participant.tables()
    return list(dict.fromkeys(tables))


def person_identifiers(user_ids):
    """What names these people, read before their rows go: display names, canonical and external ids,
    and values of identifying facts (IDENTIFYING_FACT_KEYS), each at least three characters long."""
    found = []
    for chunk in chunks(sorted(user_ids)):
        for canonical, display in MemoryUser.objects.filter(pk__in=chunk).values_list("canonical_id", "display_name"):
            found += [canonical, display]
        for channel, external in ChannelIdentity.objects.filter(user_id__in=chunk).values_list(
            "channel", "external_id"
        ):
            found += [f"{channel}:{external}", external]
        for value in Fact.objects.filter(user_id__in=chunk, key__in=IDENTIFYING_FACT_KEYS).values_list(
            "value", flat=True
        ):
            found += _strings(value)
    return [s for s in dict.fromkeys(str(s).strip() for s in found) if len(s) >= 3]


def _strings(value):
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def erase_operator_traces(needles):
    """Inside the delete transaction: recall events whose query names the person (an operator looked
    them up, for any user), buffered ones too, and the entries of admin sessions that name them (the
    admin keeps each tab's search there); the operator stays signed in. Returns (events, sessions)."""
    from django.conf import settings
    from django.db.models import Q
    from django.utils.module_loading import import_string

    from ..recall.events import recall_log

    if not needles:
        return 0, 0
    recall_log.forget_queries(needles)
    naming = Q()
    for needle in needles:
        naming |= Q(query__icontains=needle)
    events = RecallEvent.objects.filter(naming).delete()[0]
    store_class = import_string(f"{settings.SESSION_ENGINE}.SessionStore")
    sessions = 0
    for session, keys in sessions_naming(needles):
        store = store_class(session_key=session.session_key)
        for key in keys:
            store.pop(key, None)
        if any(key.startswith("_auth_") for key in keys):
            store.delete()  # the sign-in itself names them: the whole session goes
        else:
            store.save(must_create=False)
        sessions += 1
    return events, sessions


def erase_related(user_ids, fact_ids, episode_ids):
    """Inside the delete transaction, before the rows go: recall events and admin log entries naming them."""
    from django.contrib.admin.models import LogEntry
    from django.contrib.contenttypes.models import ContentType

    from ..recall.events import recall_log

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


def drop_buffered(user_ids, fact_ids, episode_ids, needles=()):
    """This process's buffered recall events and access counts naming the person go unwritten."""
    from ..recall.access import access_counter
    from ..recall.events import recall_log

    recall_log.forget(user_ids, {RecallKind.FACT: fact_ids, RecallKind.EPISODE: episode_ids})
    if needles:
        recall_log.forget_queries(needles)
    access_counter.forget(fact_ids)


def scrub_after_commit(user_ids=(), fact_ids=(), episode_ids=(), needles=()):
    """Once the deletion commits: statistics, files and buffers let go of what the deleted rows held.

    Returns the ErasureOutcome, filled in when the outermost transaction commits (at once when there is
    none around the deletion).
    """
    outcome = ErasureOutcome()

    def scrub():
        # Noted by this process while the deletion ran (a recall that read the rows before they went).
        drop_buffered(user_ids, fact_ids, episode_ids, needles)
        refreshed, problems = get_backend().scrub_after_erasure(person_tables())
        outcome.statistics_refreshed += refreshed
        outcome.problems += problems
        for participant in participants:
            if participant.scrub is None:
                continue
            try:
                outcome.problems += participant.scrub() or []
            except Exception as exc:  # noqa: BLE001  (reported in the outcome: the deletion stands)
                logger.exception("erasure: %s could not scrub", participant.name)
                outcome.problems.append(f"{participant.name}: {exc}")
        outcome.done = True
        for problem in outcome.problems:
            logger.warning("erasure not complete: %s; memory verify-erasure shows what is left", problem)

    transaction.on_commit(scrub, robust=True)
    return outcome


# ---------------------------------------------------------------- subject access


def export_person(user, out):
    """JSON Lines of everything held about `user` (a surviving memory user); returns the lines written."""
    import json

    from django.core.serializers.json import DjangoJSONEncoder
    from django.forms.models import model_to_dict

    from ..signals import person_exporting

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
    for archived in ArchivedEpisode.objects.filter(user_id__in=user_ids).order_by("started_at", "pk"):
        # An episode compaction folded into a summary: the columns it had, as they were.
        write("archived_episode", {**archived.record, "summary_episode": archived.summary_episode_id})
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
