"""What operators do: list every row, delete by id (forget a person included), count. MemoryService delegates to it.

Querysets for the /memories/ admin and the REST API (read only: filter, order, paginate them), and
deletes by id that are all-or-nothing and report the ids that did not exist.
"""

import logging
import time

from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Count, OuterRef, Prefetch, Q, Subquery
from django.db.models.functions import Coalesce

from ..domain import history
from ..domain.deletions import MEMORY_HELD, BatchDelete, existing_ids, write_deletion_record
from ..exceptions import InvalidMemoryArgument, MemoryConflict, MemoryInUse, PersonForgotten
from ..models import (
    ArchivedEpisode,
    ChannelIdentity,
    DeletionKind,
    Episode,
    Fact,
    FactHistory,
    FactType,
    FactVersion,
    MemoryRelation,
    MemoryUser,
    Procedure,
    ProcedureType,
    Promotion,
    RecallEvent,
    Scope,
    StoreItem,
)
from ..models.workspaces import scoped
from ..rules import persons, workspaces
from ..rules.validation import check_choice, check_id_list, check_limit, check_user_id, chunks, clean_text
from ..signals import users_deleting, users_footprint
from . import erasure, tombstones

logger = logging.getLogger("engram.memory")

# A forget that collides with a person's concurrent work elsewhere (a deadlock, a serialization
# failure, a row another process inserted for them meanwhile failing the foreign keys at commit) is
# tried again this many times in all, with a short growing pause; then it answers MemoryConflict (409).
FORGET_ATTEMPTS = 4
FORGET_PAUSE_S = 0.1


def count_by_user(model):
    return model.objects.filter(user=OuterRef("pk")).order_by().values("user").annotate(n=Count("id")).values("n")


class Operators:
    """Lists, batch deletes and counts for operators; MemoryService builds it and delegates."""

    def __init__(self, backend, users):
        self.backend = backend
        self.users = users

    # Querysets for the /memories/ admin and the REST API (read only: filter, order, paginate them),
    # and deletes by id that are all-or-nothing and report the ids that did not exist.

    def fact_list(self):
        """Every fact, for operators (no visibility rules: staff see all owners)."""
        return Fact.objects.all()

    def episode_list(self):
        return Episode.objects.all()

    def procedure_list(self):
        return Procedure.objects.all()

    def fact_version_list(self):
        """Every fact version (fact history, memory/domain/history.py), of facts present and deleted, current ones included."""
        return FactHistory.objects.all()

    def promotion_list(self):
        """The promotion ledger (memory/learning/promotion.py)."""
        return scoped(Promotion.objects.all(), workspaces.promotions_of)

    def relation_list(self):
        """Every edge of the memory graph (memory/recall/relations.py), with the documents it joins."""
        return scoped(MemoryRelation.objects.select_related("source", "target"), workspaces.relations_of)

    def memory_user_list(self):
        """Every memory user with `fact_count` and `episode_count`, identities prefetched."""
        return MemoryUser.objects.annotate(
            fact_count=Coalesce(Subquery(count_by_user(Fact)), 0),
            episode_count=Coalesce(Subquery(count_by_user(Episode)), 0),
        ).prefetch_related(Prefetch("identities", queryset=ChannelIdentity.objects.order_by("channel", "external_id")))

    def delete_facts(self, ids, *, max_ids=None, actor=""):
        """Delete the facts with these ids in one transaction; returns BatchDelete(deleted, not_found)."""
        return self._batch_delete(Fact, ids, max_ids, actor, DeletionKind.FACTS)

    def delete_episodes(self, ids, *, max_ids=None, actor=""):
        """Delete episodes; facts derived from them stay, their `source_episode` cleared."""
        return self._batch_delete(Episode, ids, max_ids, actor, DeletionKind.EPISODES)

    def delete_procedures(self, ids, *, max_ids=None, actor=""):
        """Delete procedures; procedures evolved from them stay, their `parent` cleared."""
        return self._batch_delete(Procedure, ids, max_ids, actor, DeletionKind.PROCEDURES)

    def delete_users(self, ids, *, cascade=False, max_ids=None, actor="", tombstone=True):
        """Delete memory users: "forget this person" with `cascade=True`.

        With `cascade`, everything that names them goes too, in one transaction: their facts,
        episodes, channel identities, the users merged into them, their recall events and admin log
        entries, the keyword indexes' copies of their words, and (through the `users_deleting`
        signal) their conversation threads and checkpoints; after the commit the database files let
        go of them too (memory/operations/erasure.py). Without it, a user who still holds memories raises
        MemoryInUse naming the `cascade` field, and nothing is deleted. Either way an audit record
        (DeletionRecord: who, when, how many, which ids; never whose name) is written.
        `BatchDelete.cascaded` counts everything that went, threads and checkpoints included;
        `BatchDelete.erasure` says what the scrub after the commit did (memory.operations.erasure.ErasureOutcome).
        With `tombstone` (the default) their ids are kept as a tombstone (memory/operations/tombstones.py), so an
        import of an older export does not bring them back unasked; `memory clear` of every user does not.
        """
        if not isinstance(cascade, bool):
            raise InvalidMemoryArgument("cascade", f"must be true or false, got {cascade!r}")
        ids = check_id_list(ids, max_ids)
        # Inside a caller's transaction a failed try cannot be repeated (the caller's snapshot and locks
        # stay): one try, its conflict answered as such.
        attempts = 1 if connection.in_atomic_block else FORGET_ATTEMPTS
        for attempt in range(1, attempts + 1):
            try:
                return self._delete_users_once(ids, cascade, actor, tombstone)
            except (OperationalError, IntegrityError) as exc:
                logger.warning(
                    "forget of memory users %s: try %d of %d met a conflict: %s", ids, attempt, attempts, exc
                )
                problem = exc
            if attempt < attempts:
                time.sleep(FORGET_PAUSE_S * attempt)
        raise MemoryConflict(
            "ids",
            f"the users' memories kept changing while they were being forgotten ({type(problem).__name__}, "
            f"{attempts} tries); nothing was deleted, try again",
        ) from problem

    def _delete_users_once(self, ids, cascade, actor, tombstone):
        """One try of delete_users, in one transaction (raises the database's conflict errors as they come)."""
        with transaction.atomic():
            found = existing_ids(MemoryUser, ids)
            not_found = [i for i in ids if i not in found]
            if not found:
                return BatchDelete(0, not_found)
            footprint = self.user_footprint(found)
            held = {what: n for what, n in footprint.items() if n and what in MEMORY_HELD}
            if not cascade and held:
                listed = ", ".join(f"{n} {what.replace('_', ' ')}" for what, n in held.items())
                raise MemoryInUse("cascade", f"the users still hold {listed}; pass cascade=true to delete them too")
            merged = set()
            for chunk in chunks(sorted(found)):
                merged.update(MemoryUser.objects.filter(merged_into__in=chunk).values_list("pk", flat=True))
            everyone = sorted(found | merged)
            # Writes for these people in flight elsewhere finish first; later ones find them gone.
            persons.lock_for_forget(everyone)
            fact_ids, episode_ids = [], []
            for chunk in chunks(everyone):
                fact_ids += Fact.objects.filter(user__in=chunk).values_list("pk", flat=True)
                episode_ids += Episode.objects.filter(user__in=chunk).values_list("pk", flat=True)
            needles = erasure.person_identifiers(everyone)
            if tombstone:
                tombstones.bury(everyone)
            # Always: without cascade the users hold no memories, but may still have threads.
            users_deleting.send(sender=MemoryUser, user_ids=everyone)
            erasure.erase_related(everyone, fact_ids, episode_ids)
            erasure.erase_operator_traces(needles)
            erasure.drop_buffered(everyone, fact_ids, episode_ids, needles)
            for chunk in chunks(everyone):
                # Their history too, versions of facts deleted long ago included: forgotten means gone.
                FactVersion.objects.filter(user__in=chunk).delete()
                Fact.objects.filter(user__in=chunk).delete()
                Episode.objects.filter(user__in=chunk).delete()  # derived facts of others keep, unlinked
                ChannelIdentity.objects.filter(user__in=chunk).delete()
            for chunk in chunks(everyone):
                MemoryUser.objects.filter(merged_into__in=chunk).update(merged_into=None)
            for chunk in chunks(everyone):
                MemoryUser.objects.filter(pk__in=chunk).delete()
            erasure.purge_indexes(self.backend, everyone)
            write_deletion_record(actor, DeletionKind.MEMORY_USERS, sorted(found), footprint)
            outcome = erasure.scrub_after_commit(everyone, fact_ids, episode_ids, needles)
        return BatchDelete(len(found), not_found, cascaded=footprint if cascade else {}, erasure=outcome)

    def hold_person(self, user_id):
        """Inside the caller's transaction: hold this person against a concurrent forget until it ends
        (memory/rules/persons.py). Raises PersonForgotten if they were forgotten: write nothing for them."""
        user_id = check_user_id("user_id", user_id, required=True)
        if user_id not in self.backend.hold_people([user_id]):
            raise PersonForgotten(user_id)

    def was_forgotten(self, user_id):
        """Whether this memory user was forgotten (a tombstone, no user with the id): for writers that
        cannot take the person's lock (a checkpoint store on another connection) and check before and after."""
        return tombstones.is_forgotten(check_user_id("user_id", user_id, required=True))

    def forgotten_sql(self, placeholder="%s", schema=""):
        """`was_forgotten` as SQL for another library's connection to this database (memory/operations/tombstones.py)."""
        return tombstones.forgotten_sql(placeholder, schema)

    def user_footprint(self, ids):
        """How much these users (and users merged into them) hold, by kind, threads and checkpoints included.

        Facts, fact versions, episodes, identities, merged users, recall events; other apps add theirs through the
        `users_footprint` signal (workflows: threads and checkpoints).
        """
        ids = sorted(set(ids))
        totals = {
            "facts": 0,
            "fact_versions": 0,
            "episodes": 0,
            "identities": 0,
            "merged_users": 0,
            "recall_events": 0,
            "store_items": 0,
            "archived_episodes": 0,
        }
        for chunk in chunks(ids):
            totals["facts"] += Fact.objects.filter(user__in=chunk).count()
            totals["fact_versions"] += FactHistory.objects.filter(user__in=chunk).count()
            totals["episodes"] += Episode.objects.filter(user__in=chunk).count()
            totals["identities"] += ChannelIdentity.objects.filter(user__in=chunk).count()
            totals["merged_users"] += MemoryUser.objects.filter(merged_into__in=chunk).count()
            totals["recall_events"] += RecallEvent.objects.filter(user_id__in=chunk).count()
            totals["store_items"] += StoreItem.objects.filter(user__in=chunk).count()
            totals["archived_episodes"] += ArchivedEpisode.objects.filter(user__in=chunk).count()
        for _, counts in users_footprint.send(sender=MemoryUser, user_ids=ids):
            for what, n in (counts or {}).items():
                totals[what] = totals.get(what, 0) + n
        return totals

    def record_deletion(self, actor, kind, ids, cascaded=None):
        """Write the audit record of a deletion another app made (threads), in the caller's transaction."""
        write_deletion_record(actor, check_choice("kind", kind, DeletionKind), list(ids), cascaded)

    def export_person(self, user_id, out):
        """Everything Engram holds about one person, as JSON Lines on `out` (a subject access request).

        One object per line, each with a "kind": the user (and users merged into them), identities,
        facts, episodes, recall events, and what other apps keep (threads and their messages, through
        the `person_exporting` signal). Returns how many lines were written.
        """
        user = self.users.resolve_user(user_id)
        return erasure.export_person(user, out)

    def _batch_delete(self, model, ids, max_ids, actor, kind):
        ids = check_id_list(ids, max_ids)
        with transaction.atomic():
            found = existing_ids(model, ids)
            if model is Fact:
                erasure.erase_related((), sorted(found), ())
                history.record_deleted(found, provenance=f"deleted by {actor}" if actor else None)
            elif model is Episode:
                erasure.erase_related((), (), sorted(found))
            # One set-based DELETE per chunk: a model nothing points at (facts) is deleted without
            # loading rows; rows that point here with SET_NULL are cleared by one UPDATE per chunk.
            for chunk in chunks(sorted(found)):
                model.objects.filter(pk__in=chunk).delete()
            if found:
                write_deletion_record(actor, kind, sorted(found))
        return BatchDelete(len(found), [i for i in ids if i not in found])

    LIST_KINDS = ("facts", "episodes", "procedures", "users")

    def list_memories(self, kind="facts", *, scope=None, agent_id=None, user_id=None, category=None, limit=20):
        """Rows of one kind for operators, newest first, filtered; `category` is the fact type, the
        episode's trigger type, the procedure type or the user's channel. Returns model instances."""
        if kind not in self.LIST_KINDS:
            raise InvalidMemoryArgument("kind", f"must be one of {', '.join(self.LIST_KINDS)}; got {kind!r}")
        limit = check_limit(limit, 20)
        given = {"scope": scope, "agent_id": agent_id, "user_id": user_id}
        allowed = {
            "facts": {"scope", "agent_id", "user_id"},
            "episodes": {"agent_id", "user_id"},
            "procedures": {"agent_id"},
            "users": {"user_id"},
        }[kind]
        for name, value in given.items():
            if value is not None and name not in allowed:
                raise InvalidMemoryArgument(name, f"does not apply to {kind}")
        if user_id is not None:
            user_id = self.users.resolve_user(user_id).pk
        if agent_id is not None:
            agent_id = clean_text("agent_id", agent_id, required=False, max_length=128)
        if kind == "facts":
            qs = Fact.objects.select_related("user").order_by("-updated_at", "-id")
            if scope is not None:
                qs = qs.filter(scope=check_choice("scope", scope, Scope))
            if agent_id is not None:
                qs = qs.filter(agent_id=agent_id)
            if user_id is not None:
                qs = qs.filter(user_id=user_id)
            if category is not None:
                qs = qs.filter(fact_type=check_choice("category", category, FactType))
        elif kind == "episodes":
            qs = Episode.objects.order_by("-started_at", "-id")
            if agent_id is not None:
                qs = qs.filter(agent_id=agent_id)
            if user_id is not None:
                qs = qs.filter(user_id=user_id)
            if category is not None:
                qs = qs.filter(trigger_type=category)
        elif kind == "procedures":
            qs = Procedure.objects.order_by("-updated_at", "-id")
            if agent_id is not None:
                qs = qs.filter(agent_id=agent_id)
            if category is not None:
                qs = qs.filter(procedure_type=check_choice("category", category, ProcedureType))
        else:
            qs = MemoryUser.objects.filter(merged_into__isnull=True).order_by("-last_seen", "-id")
            if user_id is not None:
                qs = qs.filter(pk=user_id)
            if category is not None:
                qs = qs.filter(identities__channel=category).distinct()
        return list(qs[:limit])

    def memory_counts(self):
        """Rows per memory kind, facts per scope, episodes waiting for consolidation. One query per table."""
        by_scope = dict(Fact.objects.order_by().values_list("scope").annotate(n=Count("id")))
        episodes = Episode.objects.aggregate(
            n=Count("id"), waiting=Count("id", filter=Q(processed_for_facts=False, ended_at__isnull=False))
        )
        procedures = Procedure.objects.aggregate(n=Count("id"), active=Count("id", filter=Q(is_active=True)))
        users = MemoryUser.objects.aggregate(n=Count("id"), merged=Count("id", filter=Q(merged_into__isnull=False)))
        return {
            "facts": sum(by_scope.values()),
            "facts_by_scope": {scope: by_scope.get(scope, 0) for scope in Scope.values},
            "episodes": episodes["n"],
            "episodes_unconsolidated": episodes["waiting"],
            "procedures": procedures["n"],
            "procedures_active": procedures["active"],
            "users": users["n"] - users["merged"],
            "users_merged": users["merged"],
            "identities": ChannelIdentity.objects.count(),
        }
