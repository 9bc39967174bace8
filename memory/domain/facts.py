"""Facts (semantic memory): a JSON value under a key, owned by a session, a user, an agent or everyone.

A lookup returns the most specific visible fact (session, user, agent, global). MemoryService delegates to it.
"""

import json
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.utils import timezone

from ..conf import memory_settings
from ..exceptions import InvalidMemoryArgument, MemoryNotFound
from ..models import Fact, FactAction, FactType, MemoryUser, RecallKind, Scope
from ..models.owners import fact_owner_key
from ..recall import relations
from ..recall.access import access_counter
from ..rules.owners import user_scope_key
from ..rules.validation import (
    check_as_of,
    check_choice,
    check_json,
    check_limit,
    check_search,
    check_unit_interval,
    check_user_id,
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

    def get_fact(self, key, *, agent_id="", user_id=None, session_id="", as_of=None):
        """The most specific visible fact for `key` (session, user, agent, global), or None. One query.

        `as_of` (an aware datetime): what was true then instead, from the fact history: the
        version (FactHistory) in force at that time (same visibility and specificity rules), or None. A fact
        deleted since still answers; one written since does not. Not counted as an access.
        """
        key = clean_text("key", key, max_length=255)
        viewer = make_viewer(agent_id, user_id, session_id)
        if as_of is not None:
            return history.version_as_of(key, viewer, self._as_of(as_of))
        fact = self.backend.get_fact(key, viewer)
        if fact is not None:
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
    ):
        """Create or update the fact `key` of one owner, safely under concurrent writers.

        Same value: confirmed (confidence moves CONFIRM_WEIGHT of the way to 1). Different value:
        updated when `overwrite` (counted as a contradiction; confidence becomes the new one), else
        skipped (counted as a contradiction; confidence drops by CONTRADICT_WEIGHT). A new key of a
        person who has LIMITS["MAX_FACTS_PER_USER"] facts raises LimitReached and writes nothing.
        """
        fact = self._new_fact(
            key, value, scope, agent_id, user_id, session_id, fact_type, confidence, source_episode_id, provenance
        )
        try:
            with transaction.atomic():
                if fact.user_id is not None:
                    self.backend.hold_user(fact.user_id)
                write = self._upsert_fact(fact, overwrite)  # and its history version
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
        self, key, value, scope, agent_id, user_id, session_id, fact_type, confidence, source_episode_id, provenance
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
        if source_episode_id is not None:
            source_episode_id = check_user_id("source_episode_id", source_episode_id, required=False)
            if not self.backend.episode_exists(source_episode_id):
                raise InvalidMemoryArgument("source_episode_id", f"no episode with id {source_episode_id}")
        # Each scope carries its own owner only (a database constraint says the same).
        owners = {
            Scope.SESSION: {"session_id": session_id},
            Scope.USER: {"user_id": user_id},
            Scope.AGENT: {"agent_id": agent_id},
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
            source_episode_id=source_episode_id,
            provenance=clean_text("provenance", provenance, required=False),
            search_text=fact_search_text(key, value),
            concepts=fact_concepts(key, value),
        )
        fact.keeps_type = keep_type  # an update without a fact_type keeps the stored one
        return fact

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
        if same_json(existing.value, incoming.value):
            action = WriteAction.CONFIRMED
            w = memory_settings.CONFIRM_WEIGHT
            changes = {
                "times_confirmed": ("times_confirmed + 1", []),
                "confidence": ("confidence + (1.0 - confidence) * %s", [w]),
            }
            existing.times_confirmed += 1
            existing.confidence += (1.0 - existing.confidence) * w
        elif overwrite:
            action = WriteAction.UPDATED
            replaced = ["value", "search_text", "concepts", "confidence", "source_episode_id", "provenance"]
            if not incoming.keeps_type:
                replaced.append("fact_type")
            changes = {"times_contradicted": ("times_contradicted + 1", [])}
            for name in replaced:
                changes[Fact._meta.get_field(name).column] = getattr(incoming, name)
                setattr(existing, name, getattr(incoming, name))
            existing.times_contradicted += 1
        else:
            action = WriteAction.SKIPPED
            w = memory_settings.CONTRADICT_WEIGHT
            changes = {
                "times_contradicted": ("times_contradicted + 1", []),
                "confidence": ("confidence * %s", [1.0 - w]),
            }
            existing.times_contradicted += 1
            existing.confidence *= 1.0 - w
        changes["updated_at"] = existing.updated_at = now
        # The change becomes the fact's current version; the state it replaces is kept as history.
        changes.update(history.change_columns(action, None if action == WriteAction.UPDATED else incoming))
        self.backend.update_fact(existing.pk, changes, supersede=history.enabled())
        return FactWrite(action, existing)

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
    ):
        """Visible facts whose key or value contains every word of `query`, most confident first.

        Spaces, underscores and hyphens are equivalent ("local time" finds "lesson_local_time_command");
        words match in any order; LIKE wildcards in the query are literal. A fact hidden by a more
        specific one with the same key is not returned, whatever the confidence of either.
        `as_of` (an aware datetime): the same question about what was true then, answered with the
        versions (FactHistory) in force at that time (see get_fact); not counted as accesses.
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
        if as_of is not None:
            return history.versions_as_of(
                viewer,
                self._as_of(as_of),
                tokens=tokens,
                min_confidence=min_confidence,
                fact_type=fact_type,
                limit=limit,
            )
        facts = self.backend.visible_facts(
            viewer, tokens=tokens, min_confidence=min_confidence, fact_type=fact_type, order="confidence", limit=limit
        )
        access_counter.record([f.pk for f in facts])
        return facts

    def list_facts(self, *, agent_id="", user_id=None, session_id="", fact_type=None, min_confidence=None, limit=None):
        """Every fact `viewer` sees (shadowed ones left out), by key."""
        viewer = make_viewer(agent_id, user_id, session_id)
        if fact_type is not None:
            fact_type = check_choice("fact_type", fact_type, FactType)
        if min_confidence is not None:
            min_confidence = check_unit_interval("min_confidence", min_confidence)
        if limit is not None:
            limit = check_limit(limit, None)
        return self.backend.visible_facts(
            viewer, min_confidence=min_confidence, fact_type=fact_type, order="key", limit=limit
        )

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

    def fact_history(self, fact_id=None, *, key=None, scope=None, agent_id="", user_id=None, session_id="", limit=None):
        """The versions of one fact, oldest first: by `fact_id` (a deleted fact's too), or by `key` and
        owner (`scope` with its agent_id / user_id / session_id; a user id follows merges), which
        also finds earlier facts of that key that were deleted. `limit`: only the latest so many.
        """
        limit = check_limit(limit, None)
        if (fact_id is None) == (key is None):
            raise InvalidMemoryArgument("fact_id", "give a fact id, or a key and its owner, not both")
        if fact_id is not None:
            fact_id = check_user_id("fact_id", fact_id, required=True)
            return history.versions_of(fact_id, limit=limit)
        owner = self._new_fact(
            key, None, Scope.GLOBAL if scope is None else scope, agent_id, user_id, session_id, None, None, None, ""
        )
        if owner.user_id is not None:
            owner.user_id = self.users.resolve_user(owner.user_id).pk
        return history.versions_of(scope_key=fact_owner_key(owner), key=owner.key, limit=limit)

    def _as_of(self, when):
        if not history.enabled():
            raise InvalidMemoryArgument("as_of", "fact history is off (MEMORY['FACT_HISTORY']): nothing to read from")
        return check_as_of("as_of", when)

    def optimize_search_index(self):
        """Compact the keyword indexes facts live in (substring search and recall); worth it after a bulk load.

        Every write transaction adds a segment to each; later writes and queries visit them all.
        """
        self.backend.optimize()
        self.backend.optimize_recall_index()

    def flush_access_counts(self):
        """Write buffered access counts now; returns how many facts were updated."""
        return access_counter.flush()
