"""Facts (semantic memory): a JSON value under a key, owned by a session, a user, an agent, a team of
agents or everyone.

A lookup returns the most specific visible fact (session, user, agent, team, global). MemoryService delegates to it.
"""

import json
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.utils import timezone

from ..conf import memory_settings
from ..exceptions import InvalidMemoryArgument, MemoryNotFound
from ..models import Fact, FactAction, FactType, MemoryUser, RecallKind, Scope, holds, holds_now
from ..models.owners import fact_owner_key
from ..recall import relations
from ..recall.access import access_counter
from ..rules.owners import check_member, find_team, user_scope_key
from ..rules.validation import (
    check_as_of,
    check_choice,
    check_json,
    check_limit,
    check_search,
    check_tags,
    check_unit_interval,
    check_user_id,
    check_user_in_workspace,
    check_valid_time,
    clean_text,
    make_viewer,
)
from ..text import fact_concepts, fact_search_text, search_tokens
from . import history, limits

# The longest text a fact search or a procedure match takes (a whole message is fine; a book is not).
MAX_SEARCH_LENGTH = 4000
# The most words a fact search takes (a whole paragraph: yes; SQLite refuses expressions past ~1,000 terms).
MAX_FACT_SEARCH_WORDS = 256


class WriteAction:
    """What a fact write did."""

    CREATED = "created"
    UPDATED = "updated"
    CONFIRMED = "confirmed"
    SKIPPED = "skipped"
    # Consolidation only: the stored fact changed after the episode began (the run's own remember
    # node, or a later conversation), so the episode's older word is not replayed over it.
    KEPT_NEWER = "kept_newer"


@dataclass(frozen=True)
class Times:
    """A point-in-time read's times: world time (valid_at) and recorded time (as_of, None: now)."""

    valid_at: object
    as_of: object


@dataclass(frozen=True)
class FactWrite:
    action: str
    fact: Fact

    @property
    def written(self):
        return self.action != WriteAction.SKIPPED


def same_json(a, b):
    """Whether two JSON values are equal as stored (key order aside)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


class Facts:
    """Reads and writes of facts; MemoryService builds it and delegates."""

    def __init__(self, backend, users, recall_index):
        self.backend = backend
        self.users = users
        self.recall_index = recall_index

    def get_fact(self, key, *, agent_id="", user_id=None, session_id="", as_of=None, valid_at=None):
        """The most specific visible fact for `key` (session, user, agent, the agent's teams, global)
        that holds now (its valid time contains the present), or None. One query.

        `valid_at` (world time): the value that held in the world then instead ("where did she live
        in 2024?"): the state (FactHistory) whose valid time contains it, a value closed by a later
        one included. `as_of` (recorded time): what the memory said then, from the fact history;
        with `as_of` alone, what held at that time as recorded then. Either takes an aware
        datetime, a date or an ISO 8601 string; same visibility and specificity rules; a fact
        deleted since holds nothing. Point-in-time reads are not counted as accesses.
        """
        key = clean_text("key", key, max_length=255)
        viewer = make_viewer(agent_id, user_id, session_id)
        when = self._when(as_of, valid_at)
        if when is not None:
            if not history.enabled():  # no history: the stored values are all there is
                found = self.backend.get_fact(key, viewer)
                return found if found is not None and holds(found, when.valid_at) else None
            return history.version_at(key, viewer, valid_at=when.valid_at, as_of=when.as_of)
        fact = self.backend.get_fact(key, viewer)
        if fact is None:
            return None
        if not holds_now(fact):
            # Closed, or dated to start later: what holds now is another state, if any (rare: a
            # later value of the key usually closes the old one and holds now on this row).
            return self.get_fact(
                key, agent_id=agent_id, user_id=user_id, session_id=session_id, valid_at=timezone.now()
            )
        access_counter.record([fact.pk])
        return fact

    def set_fact(
        self,
        key,
        value,
        *,
        scope=Scope.GLOBAL,
        agent_id="",
        user_id=None,
        session_id="",
        fact_type=None,
        confidence=None,
        overwrite=True,
        source_episode_id=None,
        provenance="",
        valid_from=None,
        valid_to=None,
        tags=None,
        team=None,
    ):
        """Create or update the fact `key` of one owner, safely under concurrent writers.

        `scope="team"` with `team` (its name, or id): a fact every member of that team sees. An
        `agent_id` given with it must be a member (InvalidMemoryArgument "agent_id" if not); the fact
        is the team's, not that agent's.

        `tags`: labels for the fact (check_tags); given, they replace the stored ones on any write
        that is not skipped; None keeps them.

        Same value: confirmed (confidence moves CONFIRM_WEIGHT of the way to 1). Different value:
        updated when `overwrite` (counted as a contradiction; confidence becomes the new one), else
        skipped (counted as a contradiction; confidence drops by CONTRADICT_WEIGHT). A new key of a
        person who has LIMITS["MAX_FACTS_PER_USER"] facts raises LimitReached and writes nothing.

        `valid_from` / `valid_to`: when the value holds in the world (None: since always / until
        further notice; a datetime, a date or an ISO 8601 string; valid_to after valid_from). An
        update closes the value it replaces: the new value holds from its valid_from (now when not
        given) and the old one's valid time ends there, kept in fact history (see get_fact's
        valid_at). A confirmation with a valid time sets it. A value that ended before now cannot
        replace one that holds now (InvalidMemoryArgument "valid_to": the key keeps one timeline).
        """
        fact = self._new_fact(
            key, value, scope, agent_id, user_id, session_id, fact_type, confidence, source_episode_id, provenance, team
        )
        fact.valid_from, fact.valid_to = check_valid_time(valid_from, valid_to)
        fact.keeps_tags = tags is None
        fact.tags = [] if tags is None else check_tags("tags", tags)
        try:
            with transaction.atomic():
                if fact.user_id is not None:
                    check_user_in_workspace("user_id", fact.user_id)
                    self.backend.hold_user(fact.user_id)
                write = self._upsert_fact(fact, overwrite)  # and its history version, closed
                if write.action == WriteAction.CREATED:
                    limits.refuse_past_user_cap(write.fact)  # raises: nothing of this write stays
                limits.enforce_versions(write.fact)
                if write.action in (WriteAction.CREATED, WriteAction.UPDATED):
                    self.recall_index.embed_for_recall(RecallKind.FACT, [write.fact.pk])
                if write.action == WriteAction.UPDATED and history.enabled():
                    # The graph's `contradicts` edge, once this write has committed (memory/recall/relations.py).
                    fact_id = write.fact.pk
                    transaction.on_commit(lambda: relations.contradictions.note(fact_id))
                if write.action == WriteAction.CREATED:
                    limits.enforce_after_create(limits.FACTS, write.fact)
                return write
        except IntegrityError as exc:
            # An unknown user id reaches the insert as NULL, which the scope constraint refuses.
            if fact.user_id is not None and not MemoryUser.objects.filter(pk=fact.user_id).exists():
                raise InvalidMemoryArgument("user_id", f"no memory user with id {fact.user_id}") from exc
            raise

    def _new_fact(
        self,
        key,
        value,
        scope,
        agent_id,
        user_id,
        session_id,
        fact_type,
        confidence,
        source_episode_id,
        provenance,
        team=None,
    ):
        key = clean_text("key", key, max_length=255)
        check_json("value", value)
        scope = check_choice("scope", scope, Scope)
        keep_type = fact_type is None
        fact_type = check_choice("fact_type", FactType.WORLD_KNOWLEDGE if keep_type else fact_type, FactType)
        confidence = check_unit_interval(
            "confidence", memory_settings.DEFAULT_CONFIDENCE if confidence is None else confidence
        )
        agent_id = clean_text("agent_id", agent_id, required=scope == Scope.AGENT, max_length=128)
        session_id = clean_text("session_id", session_id, required=scope == Scope.SESSION, max_length=128)
        user_id = check_user_id("user_id", user_id, required=scope == Scope.USER)
        team_id = self._team_of(scope, team, agent_id)
        if source_episode_id is not None:
            source_episode_id = check_user_id("source_episode_id", source_episode_id, required=False)
            if not self.backend.episode_exists(source_episode_id):
                raise InvalidMemoryArgument("source_episode_id", f"no episode with id {source_episode_id}")
        # Each scope carries its own owner only (a database constraint says the same).
        owners = {
            Scope.SESSION: {"session_id": session_id},
            Scope.USER: {"user_id": user_id},
            Scope.AGENT: {"agent_id": agent_id},
            Scope.TEAM: {"team_id": team_id},
            Scope.GLOBAL: {},
        }[scope]
        fact = Fact(
            key=key,
            value=value,
            scope=scope,
            fact_type=fact_type,
            confidence=confidence,
            agent_id=owners.get("agent_id", ""),
            user_id=owners.get("user_id"),
            session_id=owners.get("session_id", ""),
            team_id=owners.get("team_id"),
            source_episode_id=source_episode_id,
            provenance=clean_text("provenance", provenance, required=False),
            search_text=fact_search_text(key, value),
            concepts=fact_concepts(key, value),
        )
        fact.keeps_type = keep_type  # an update without a fact_type keeps the stored one
        return fact

    @staticmethod
    def _team_of(scope, team, agent_id):
        """The team id of a team-scoped write (its writer `agent_id`, if any, a member), else None;
        a team given with another scope is refused rather than ignored."""
        if scope != Scope.TEAM:
            if team not in (None, ""):
                raise InvalidMemoryArgument("team", f"is only for scope 'team', not {scope!r}")
            return None
        if team in (None, ""):
            raise InvalidMemoryArgument("team", "is required for scope 'team'")
        found = find_team("team", team)
        if agent_id:
            check_member(found, agent_id)
        return found.pk

    def _upsert_fact(self, fact, overwrite):
        existing = self.backend.owned_fact(fact, lock=True)
        if existing is None:
            if self.backend.insert_fact_if_absent(fact):
                return FactWrite(WriteAction.CREATED, fact)
            # A concurrent writer created it first: wait for its row and treat ours as a second write.
            existing = self.backend.owned_fact(fact, lock=True)
            if existing is None:  # pragma: no cover - the conflicting row vanished between statements
                raise IntegrityError(f"fact {fact.key!r} conflicted with a row that no longer exists")
        return self._apply_write(existing, fact, overwrite)

    def _apply_write(self, existing, incoming, overwrite):
        """Confirm, replace or refuse a second write of the same key; counters move in the database."""
        now = timezone.now()
        closing = None  # an update's: when the value it replaces stops holding
        if same_json(existing.value, incoming.value):
            action = WriteAction.CONFIRMED
            w = memory_settings.CONFIRM_WEIGHT
            changes = {
                "times_confirmed": ("times_confirmed + 1", []),
                "confidence": ("confidence + (1.0 - confidence) * %s", [w]),
            }
            existing.times_confirmed += 1
            existing.confidence += (1.0 - existing.confidence) * w
            changes.update(self._given_valid_time(existing, incoming))
            # An end given to the same value ends it in history too (else the superseded state,
            # open-ended, would still answer for later times).
            closing = incoming.valid_to
        elif overwrite:
            action = WriteAction.UPDATED
            closing = self._closing(existing, incoming, now)
            changes = self._given_valid_time(existing, incoming, replace=True)
            replaced = ["value", "search_text", "concepts", "confidence", "source_episode_id", "provenance"]
            if not incoming.keeps_type:
                replaced.append("fact_type")
            changes["times_contradicted"] = ("times_contradicted + 1", [])
            for name in replaced:
                changes[Fact._meta.get_field(name).column] = getattr(incoming, name)
                setattr(existing, name, getattr(incoming, name))
            existing.times_contradicted += 1
        else:
            action = WriteAction.SKIPPED
            incoming.keeps_tags = True  # a refused write changes nothing of the fact
            w = memory_settings.CONTRADICT_WEIGHT
            changes = {
                "times_contradicted": ("times_contradicted + 1", []),
                "confidence": ("confidence * %s", [1.0 - w]),
            }
            existing.times_contradicted += 1
            existing.confidence *= 1.0 - w
        if not getattr(incoming, "keeps_tags", True):
            changes["tags"] = existing.tags = incoming.tags
        changes["updated_at"] = existing.updated_at = now
        # The change becomes the fact's current version; the state it replaces is kept as history.
        changes.update(history.change_columns(action, None if action == WriteAction.UPDATED else incoming))
        self.backend.update_fact(existing.pk, changes, supersede=history.enabled(), closes=closing)
        return FactWrite(action, existing)

    @staticmethod
    def _closing(existing, incoming, now):
        """When an update's new value starts and so the old one's valid time ends (None: the new
        value corrects the old one over the same time instead). Sets the new value's valid_from;
        refuses a value that ended before now in place of one that holds now."""
        if incoming.valid_to is not None and incoming.valid_to <= now and holds(existing, now):
            raise InvalidMemoryArgument(
                "valid_to",
                f"ends before now ({incoming.valid_to.isoformat()}) while the stored value of {existing.key!r} "
                "holds now: a past value cannot replace a current one (a key keeps one timeline; "
                "store the past value under a key of its own)",
            )
        starts = now if incoming.valid_from is None else incoming.valid_from
        if existing.valid_from is not None and starts <= existing.valid_from:
            return None
        incoming.valid_from = starts
        return starts

    @staticmethod
    def _given_valid_time(existing, incoming, replace=False):
        """The valid-time columns a write sets: those it gives (all of them when it `replace`s the value)."""
        changes = {}
        for name in ("valid_from", "valid_to"):
            value = getattr(incoming, name)
            if replace or value is not None:
                changes[name] = value
                setattr(existing, name, value)
        return changes

    def stored_fact(self, arguments):
        """The fact set_fact(**arguments) would write to, as stored now (None when there is none)."""
        probe = self._new_fact(
            arguments["key"],
            arguments["value"],
            arguments.get("scope", Scope.GLOBAL),
            arguments.get("agent_id", ""),
            arguments.get("user_id"),
            arguments.get("session_id", ""),
            None,
            None,
            None,
            "",
            arguments.get("team"),
        )
        return self.backend.owned_fact(probe, lock=True)

    def edit_fact(self, fact_id, *, value, confidence, fact_type):
        """An operator's correction of one fact (the admin's form): its value, confidence and type.

        Checked as set_fact checks them (InvalidMemoryArgument names the field; nothing changes);
        the key and owner stay. The recall document follows (triggers) and its vector is recomputed
        like any write's. Returns the fact.
        """
        check_json("value", value)
        confidence = check_unit_interval("confidence", confidence)
        fact_type = check_choice("fact_type", fact_type, FactType)
        with transaction.atomic():
            try:
                fact = Fact.objects.select_for_update().get(pk=fact_id)
            except (Fact.DoesNotExist, ValueError, TypeError):
                raise MemoryNotFound("fact", fact_id) from None
            history.supersede([fact.pk])
            fact.value, fact.confidence, fact.fact_type = value, confidence, fact_type
            fact.search_text = fact_search_text(fact.key, value)
            fact.concepts = fact_concepts(fact.key, value)
            fact.provenance = "edited by an operator"
            changed = history.change_columns(FactAction.UPDATED)
            for column, change in changed.items():
                setattr(fact, column, change)
            fact.save(
                update_fields=[
                    "value",
                    "confidence",
                    "fact_type",
                    "search_text",
                    "concepts",
                    "provenance",
                    "updated_at",
                    *changed,
                ]
            )
            limit = limits.limit_for(limits.VERSIONS, fact.agent_id)
            if limit is not None:  # edits bump no counter, so enforce_versions could not tell
                limits.trim_versions(fact.pk, limit)
            self.recall_index.embed_for_recall(RecallKind.FACT, [fact.pk])
            if history.enabled():
                transaction.on_commit(lambda: relations.contradictions.note(fact.pk))
        return fact

    def search_facts(
        self,
        query,
        *,
        agent_id="",
        user_id=None,
        session_id="",
        min_confidence=None,
        fact_type=None,
        limit=None,
        as_of=None,
        valid_at=None,
    ):
        """Visible facts whose key or value contains every word of `query`, most confident first.

        Spaces, underscores and hyphens are equivalent ("local time" finds "lesson_local_time_command");
        words match in any order; LIKE wildcards in the query are literal. A fact hidden by a more
        specific one with the same key is not returned, whatever the confidence of either.
        Only facts that hold now (their valid time contains the present). `valid_at` (world time)
        and `as_of` (recorded time): the same question about another time, answered with the
        states (FactHistory) that held then (see get_fact); not counted as accesses.
        """
        if not isinstance(query, str):
            raise InvalidMemoryArgument("query", "must be a string")
        query = check_search("query", query, max_words=None, max_length=MAX_SEARCH_LENGTH)
        tokens = search_tokens(query)
        if len(tokens) > MAX_FACT_SEARCH_WORDS:  # each word is a term of one SQL expression; SQLite stops near 1,000
            raise InvalidMemoryArgument(
                "query", f"has {len(tokens)} words; a search takes at most {MAX_FACT_SEARCH_WORDS}"
            )
        if not tokens:
            raise InvalidMemoryArgument("query", "must contain at least one word")
        viewer = make_viewer(agent_id, user_id, session_id)
        min_confidence = check_unit_interval(
            "min_confidence", memory_settings.SEARCH_MIN_CONFIDENCE if min_confidence is None else min_confidence
        )
        limit = check_limit(limit, memory_settings.SEARCH_LIMIT)
        if fact_type is not None:
            fact_type = check_choice("fact_type", fact_type, FactType)
        when = self._when(as_of, valid_at)
        if when is None:
            facts = self.backend.visible_facts(
                viewer,
                tokens=tokens,
                min_confidence=min_confidence,
                fact_type=fact_type,
                order="confidence",
                limit=limit,
            )
            if all(holds_now(f) for f in facts):
                access_counter.record([f.pk for f in facts])
                return facts
            when = Times(timezone.now(), None)  # a closed or later-dated fact among them: read the states that hold now
        if not history.enabled():  # no history: the stored values are all there is
            facts = self.backend.visible_facts(
                viewer, tokens=tokens, min_confidence=min_confidence, fact_type=fact_type, order="confidence"
            )
            return [f for f in facts if holds(f, when.valid_at)][:limit]
        return history.versions_at(
            viewer,
            valid_at=when.valid_at,
            as_of=when.as_of,
            tokens=tokens,
            min_confidence=min_confidence,
            fact_type=fact_type,
            limit=limit,
        )

    def list_facts(self, *, agent_id="", user_id=None, session_id="", fact_type=None, min_confidence=None, limit=None):
        """Every fact `viewer` sees (shadowed ones left out) that holds now, by key."""
        viewer = make_viewer(agent_id, user_id, session_id)
        if fact_type is not None:
            fact_type = check_choice("fact_type", fact_type, FactType)
        if min_confidence is not None:
            min_confidence = check_unit_interval("min_confidence", min_confidence)
        if limit is not None:
            limit = check_limit(limit, None)
        now = timezone.now()
        facts = self.backend.visible_facts(
            viewer, min_confidence=min_confidence, fact_type=fact_type, order="key", limit=limit
        )
        return [f for f in facts if holds(f, now)]

    def user_facts(self, user_id, *, limit=None):
        """The user-scoped facts of a user (following merges), most confident first."""
        user_id = check_user_id("user_id", user_id, required=True)
        qs = Fact.objects.filter(scope_key=user_scope_key(user_id)).order_by("-confidence", "key")
        if limit is not None:
            qs = qs[: check_limit(limit, None)]
        return list(qs)

    def delete_fact(self, fact_id):
        """Delete one fact (its history keeps a `deleted` version); True if it existed."""
        with transaction.atomic():
            history.record_deleted([fact_id])
            deleted, _ = Fact.objects.filter(pk=fact_id).delete()
        return bool(deleted)

    def fact_history(
        self, fact_id=None, *, key=None, scope=None, agent_id="", user_id=None, session_id="", team=None, limit=None
    ):
        """The versions of one fact, oldest first: by `fact_id` (a deleted fact's too), or by `key` and
        owner (`scope` with its agent_id / user_id / session_id / team; a user id follows merges), which
        also finds earlier facts of that key that were deleted. `limit`: only the latest so many.
        """
        limit = check_limit(limit, None)
        if (fact_id is None) == (key is None):
            raise InvalidMemoryArgument("fact_id", "give a fact id, or a key and its owner, not both")
        if fact_id is not None:
            fact_id = check_user_id("fact_id", fact_id, required=True)
            return history.versions_of(fact_id, limit=limit)
        owner = self._new_fact(
            key,
            None,
            Scope.GLOBAL if scope is None else scope,
            agent_id,
            user_id,
            session_id,
            None,
            None,
            None,
            "",
            team,
        )
        if owner.user_id is not None:
            owner.user_id = self.users.resolve_user(owner.user_id).pk
        return history.versions_of(scope_key=fact_owner_key(owner), key=owner.key, limit=limit)

    def _when(self, as_of, valid_at):
        """The times of a point-in-time read (None for a read of what holds now): `valid_at` (world
        time; with `as_of` alone, that time) and `as_of` (recorded time)."""
        if as_of is None and valid_at is None:
            return None
        valid_at = None if valid_at is None else check_as_of("valid_at", valid_at)
        if as_of is not None:
            if not history.enabled():
                raise InvalidMemoryArgument(
                    "as_of", "fact history is off (MEMORY['FACT_HISTORY']): nothing to read from"
                )
            as_of = check_as_of("as_of", as_of)
        return Times(as_of if valid_at is None else valid_at, as_of)

    def read_times(self, *, as_of=None, valid_at=None):
        """The checked times of a point-in-time read (Times), or None for a read of what holds now."""
        return self._when(as_of, valid_at)

    def states_at(self, viewer, keys, times):
        """{(owner key, key): the state (FactHistory; a Fact without history) of each of these keys
        of the viewer's owners at `times` (read_times)}: what recall shows for the facts it found."""
        if not history.enabled():
            facts = [self.backend.get_fact(key, viewer) for key in set(keys)]
            return {(f.scope_key, f.key): f for f in facts if f is not None and holds(f, times.valid_at)}
        return history.states_of(viewer, keys, valid_at=times.valid_at, as_of=times.as_of)

    def optimize_search_index(self):
        """Compact the keyword indexes facts live in (substring search and recall); worth it after a bulk load.

        Every write transaction adds a segment to each; later writes and queries visit them all.
        """
        self.backend.optimize()
        self.backend.optimize_recall_index()

    def flush_access_counts(self):
        """Write buffered access counts now; returns how many facts were updated."""
        return access_counter.flush()
