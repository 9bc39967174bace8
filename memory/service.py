"""MemoryService: the one place that reads and writes facts, episodes, procedures and memory users."""
import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import IntegrityError, OperationalError, transaction
from django.db.models import (
    CharField,
    Count,
    F,
    FloatField,
    OuterRef,
    Prefetch,
    Q,
    Subquery,
    Value,
)
from django.db.models.functions import Cast, Coalesce, Concat
from django.utils import timezone

from . import erasure, pruning
from .access import access_counter
from .backends import get_backend
from .conf import memory_settings
from .exceptions import InvalidMemoryArgument, MemoryConflict, MemoryInUse, MemoryNotFound
from .models import (
    ChannelIdentity,
    ConsolidationRun,
    DeletionKind,
    DeletionRecord,
    Episode,
    Fact,
    FactType,
    MemoryUser,
    Procedure,
    ProcedureSource,
    ProcedureType,
    RecallEvent,
    Scope,
)
from .models import RecallKind
from .recall_service import RecallMixin
from .signals import users_deleting, users_footprint, users_merged
from .text import fact_search_text, search_tokens
from .validation import check_json, check_search, clean_text


# The longest text a fact search or a procedure match takes (a whole message is fine; a book is not).
MAX_SEARCH_LENGTH = 4000
# The most words a fact search takes (a whole paragraph: yes; SQLite refuses expressions past ~1,000 terms).
MAX_FACT_SEARCH_WORDS = 256

# Attempts of a merge that keeps meeting concurrent merges of the same users before it gives up.
_MERGE_ATTEMPTS = 5


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


@dataclass(frozen=True)
class Viewer:
    """Who is asking: an agent, the user it talks to, and the session. Each part may be absent.

    A viewer sees global facts, the agent's facts, the user's facts and the session's facts.
    """

    agent_id: str = ""
    user_id: int | None = None
    session_id: str = ""


def _survivor_id(user_id):
    """The id of the user `user_id` was merged into, or `user_id` itself, inside the query.

    Merges keep `merged_into` pointing at the surviving user (never at another merged user), so one
    hop is enough and a lookup by a stale id stays one query.
    """
    merged_into = Subquery(MemoryUser.objects.filter(pk=user_id).order_by().values("merged_into_id")[:1])
    return Coalesce(merged_into, Value(user_id))


def _user_scope_key(user_id):
    return Concat(Value("user:"), Cast(_survivor_id(user_id), CharField()))


@dataclass
class UserContext:
    """What a workflow knows of a user, ready to be put into state or a prompt."""

    user_id: int
    canonical_id: str
    display_name: str
    identities: list[dict]
    preferences: dict[str, Any]
    facts: list[dict]
    recent_episodes: list[dict]
    fact_count: int
    episode_count: int
    total_conversations: int
    last_seen: datetime | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def of(cls, user, identities, facts, episodes, **counts):
        """The context of `user` from its identity, fact and episode rows; `counts`: the count fields."""
        return cls(
            user_id=user.pk,
            canonical_id=user.canonical_id,
            display_name=user.display_name,
            identities=[{"channel": i.channel, "external_id": i.external_id} for i in identities],
            preferences={f.key: f.value for f in facts if f.fact_type == FactType.USER_PREFERENCE},
            facts=[
                {"key": f.key, "value": f.value, "fact_type": f.fact_type, "confidence": round(f.confidence, 3)}
                for f in facts
            ],
            recent_episodes=[
                {
                    "id": e.pk,
                    "summary": e.summary,
                    "success": e.success,
                    "started_at": e.started_at.isoformat(),
                    "trigger_type": e.trigger_type,
                }
                for e in episodes
            ],
            **counts,
        )

    def as_dict(self):
        """A JSON-serialisable dict (timestamps as ISO 8601 strings)."""
        data = {k: v for k, v in self.__dict__.items() if k != "extra"}
        data["last_seen"] = self.last_seen.isoformat() if self.last_seen else None
        return data


@dataclass(frozen=True)
class Identified:
    """What `MemoryService.identify` found: the user's context, and whether the user is new."""

    context: UserContext
    created: bool


_CHOICE_VALUES = {c: frozenset(c.values) for c in (Scope, FactType, ProcedureType, ProcedureSource, DeletionKind)}


def _check_text(field_name, value, *, required=True, max_length=None):
    return clean_text(field_name, value, required=required, max_length=max_length)


_CHANNEL = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


def _check_channel(value):
    """A channel name: lower-case letters, digits, '_', '.', '-' (no ':', which joins canonical ids)."""
    channel = _check_text("channel", value, max_length=50).lower()
    if not _CHANNEL.match(channel):
        raise InvalidMemoryArgument("channel", f"must be letters, digits, '_', '.' or '-', got {value!r}")
    return channel


def _check_choice(field_name, value, choices):
    if value not in _CHOICE_VALUES[choices]:
        raise InvalidMemoryArgument(field_name, f"must be one of {', '.join(choices.values)}; got {value!r}")
    return value


def _check_unit_interval(field_name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidMemoryArgument(field_name, f"must be a number from 0 to 1, got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise InvalidMemoryArgument(field_name, f"must be from 0 to 1, got {value}")
    return float(value)


def _check_json(field_name, value):
    return check_json(field_name, value)


def _check_user_id(field_name, value, *, required):
    if value is None:
        if required:
            raise InvalidMemoryArgument(field_name, "is required")
        return None
    if isinstance(value, MemoryUser):
        return value.pk
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidMemoryArgument(field_name, f"must be a positive integer id, got {value!r}")
    return value


def _check_limit(value, default):
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidMemoryArgument("limit", f"must be a positive integer, got {value!r}")
    return value


def _viewer(agent_id, user_id, session_id):
    return Viewer(
        agent_id=_check_text("agent_id", agent_id, required=False, max_length=128),
        user_id=_check_user_id("user_id", user_id, required=False),
        session_id=_check_text("session_id", session_id, required=False, max_length=128),
    )


class MemoryService(RecallMixin):
    """Every memory question and write goes through here; see the README for the rules it keeps."""

    def __init__(self):
        self.backend = get_backend()

    # ------------------------------------------------------------------ facts

    def get_fact(self, key, *, agent_id="", user_id=None, session_id=""):
        """The most specific visible fact for `key` (session, user, agent, global), or None. One query."""
        key = _check_text("key", key, max_length=255)
        viewer = _viewer(agent_id, user_id, session_id)
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
        skipped (counted as a contradiction; confidence drops by CONTRADICT_WEIGHT).
        """
        fact = self._new_fact(
            key, value, scope, agent_id, user_id, session_id, fact_type, confidence, source_episode_id, provenance
        )
        try:
            with transaction.atomic():
                if fact.user_id is not None:
                    self.backend.hold_user(fact.user_id)
                write = self._upsert_fact(fact, overwrite)
                if write.action in (WriteAction.CREATED, WriteAction.UPDATED):
                    self._embed_for_recall(RecallKind.FACT, [write.fact.pk])
                if write.action == WriteAction.CREATED:
                    pruning.enforce_after_create(pruning.FACTS, write.fact)
                return write
        except IntegrityError as exc:
            # An unknown user id reaches the insert as NULL, which the scope constraint refuses.
            if fact.user_id is not None and not MemoryUser.objects.filter(pk=fact.user_id).exists():
                raise InvalidMemoryArgument("user_id", f"no memory user with id {fact.user_id}") from exc
            raise

    def _new_fact(self, key, value, scope, agent_id, user_id, session_id, fact_type, confidence, source_episode_id, provenance):
        key = _check_text("key", key, max_length=255)
        _check_json("value", value)
        scope = _check_choice("scope", scope, Scope)
        keep_type = fact_type is None
        fact_type = _check_choice("fact_type", FactType.WORLD_KNOWLEDGE if keep_type else fact_type, FactType)
        confidence = _check_unit_interval(
            "confidence", memory_settings.DEFAULT_CONFIDENCE if confidence is None else confidence
        )
        agent_id = _check_text("agent_id", agent_id, required=scope == Scope.AGENT, max_length=128)
        session_id = _check_text("session_id", session_id, required=scope == Scope.SESSION, max_length=128)
        user_id = _check_user_id("user_id", user_id, required=scope == Scope.USER)
        if source_episode_id is not None:
            source_episode_id = _check_user_id("source_episode_id", source_episode_id, required=False)
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
            provenance=_check_text("provenance", provenance, required=False),
            search_text=fact_search_text(key, value),
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
        if _same_json(existing.value, incoming.value):
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
            replaced = ["value", "search_text", "confidence", "source_episode_id", "provenance"]
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
        self.backend.update_fact(existing.pk, changes)
        return FactWrite(action, existing)

    def edit_fact(self, fact_id, *, value, confidence, fact_type):
        """An operator's correction of one fact (the admin's form): its value, confidence and type.

        Checked as set_fact checks them (InvalidMemoryArgument names the field; nothing changes);
        the key and owner stay. The recall document follows (triggers) and its vector is recomputed
        like any write's. Returns the fact.
        """
        _check_json("value", value)
        confidence = _check_unit_interval("confidence", confidence)
        fact_type = _check_choice("fact_type", fact_type, FactType)
        with transaction.atomic():
            try:
                fact = Fact.objects.select_for_update().get(pk=fact_id)
            except (Fact.DoesNotExist, ValueError, TypeError):
                raise MemoryNotFound("fact", fact_id) from None
            fact.value, fact.confidence, fact.fact_type = value, confidence, fact_type
            fact.search_text = fact_search_text(fact.key, value)
            fact.provenance = "edited by an operator"
            fact.save(update_fields=["value", "confidence", "fact_type", "search_text", "provenance", "updated_at"])
            self._embed_for_recall(RecallKind.FACT, [fact.pk])
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
    ):
        """Visible facts whose key or value contains every word of `query`, most confident first.

        Spaces, underscores and hyphens are equivalent ("local time" finds "lesson_local_time_command");
        words match in any order; LIKE wildcards in the query are literal. A fact hidden by a more
        specific one with the same key is not returned, whatever the confidence of either.
        """
        if not isinstance(query, str):
            raise InvalidMemoryArgument("query", "must be a string")
        query = check_search("query", query, max_words=None, max_length=MAX_SEARCH_LENGTH)
        tokens = search_tokens(query)
        if len(tokens) > MAX_FACT_SEARCH_WORDS:  # each word is a term of one SQL expression; SQLite stops near 1,000
            raise InvalidMemoryArgument("query", f"has {len(tokens)} words; a search takes at most {MAX_FACT_SEARCH_WORDS}")
        if not tokens:
            raise InvalidMemoryArgument("query", "must contain at least one word")
        viewer = _viewer(agent_id, user_id, session_id)
        min_confidence = _check_unit_interval(
            "min_confidence", memory_settings.SEARCH_MIN_CONFIDENCE if min_confidence is None else min_confidence
        )
        limit = _check_limit(limit, memory_settings.SEARCH_LIMIT)
        if fact_type is not None:
            fact_type = _check_choice("fact_type", fact_type, FactType)
        facts = self.backend.visible_facts(
            viewer, tokens=tokens, min_confidence=min_confidence, fact_type=fact_type, order="confidence", limit=limit
        )
        access_counter.record([f.pk for f in facts])
        return facts

    def list_facts(self, *, agent_id="", user_id=None, session_id="", fact_type=None, min_confidence=None, limit=None):
        """Every fact `viewer` sees (shadowed ones left out), by key."""
        viewer = _viewer(agent_id, user_id, session_id)
        if fact_type is not None:
            fact_type = _check_choice("fact_type", fact_type, FactType)
        if min_confidence is not None:
            min_confidence = _check_unit_interval("min_confidence", min_confidence)
        if limit is not None:
            limit = _check_limit(limit, None)
        return self.backend.visible_facts(
            viewer, min_confidence=min_confidence, fact_type=fact_type, order="key", limit=limit
        )

    def user_facts(self, user_id, *, limit=None):
        """The user-scoped facts of a user (following merges), most confident first."""
        user_id = _check_user_id("user_id", user_id, required=True)
        qs = Fact.objects.filter(scope_key=_user_scope_key(user_id)).order_by("-confidence", "key")
        if limit is not None:
            qs = qs[: _check_limit(limit, None)]
        return list(qs)

    def delete_fact(self, fact_id):
        """Delete one fact; True if it existed."""
        deleted, _ = Fact.objects.filter(pk=fact_id).delete()
        return bool(deleted)

    def optimize_search_index(self):
        """Compact the keyword indexes facts live in (substring search and recall); worth it after a bulk load.

        Every write transaction adds a segment to each; later writes and queries visit them all.
        """
        self.backend.optimize()
        self.backend.optimize_recall_index()

    def flush_access_counts(self):
        """Write buffered access counts now; returns how many facts were updated."""
        return access_counter.flush()

    # --------------------------------------------------------------- episodes

    def start_episode(self, *, agent_id="", user_id=None, session_id="", workflow="", trigger_type="", trigger_input=None):
        user_id = _check_user_id("user_id", user_id, required=False)
        with transaction.atomic():
            if user_id is not None:
                self.backend.hold_user(user_id)
                user_id = self.resolve_user(user_id).pk
            episode = Episode.objects.create(
                agent_id=_check_text("agent_id", agent_id, required=False, max_length=128),
                user_id=user_id,
                session_id=_check_text("session_id", session_id, required=False, max_length=128),
                workflow=_check_text("workflow", workflow, required=False, max_length=128),
                trigger_type=_check_text("trigger_type", trigger_type, required=False, max_length=50),
                trigger_input=_check_json("trigger_input", {} if trigger_input is None else trigger_input),
            )
            pruning.enforce_after_create(pruning.EPISODES, episode)
        return episode

    def _append_to_episode(self, episode_id, field_name, item):
        with transaction.atomic():
            episode = self._locked_episode(episode_id)
            getattr(episode, field_name).append(item)
            Episode.objects.filter(pk=episode.pk).update(**{field_name: getattr(episode, field_name)})
            if field_name == "conversation":
                self._embed_for_recall(RecallKind.EPISODE, [episode.pk])
        return episode

    def _locked_episode(self, episode_id):
        try:
            return Episode.objects.select_for_update().get(pk=episode_id)
        except (Episode.DoesNotExist, ValueError, TypeError):
            raise MemoryNotFound("episode", episode_id) from None

    def add_message(self, episode_id, role, content):
        """Append one message ({"role", "content"}) to an episode's conversation."""
        role = _check_text("role", role, max_length=50)
        _check_json("content", content)
        return self._append_to_episode(episode_id, "conversation", {"role": role, "content": content})

    def add_action(self, episode_id, action):
        """Append one action (a tool call and its result, as a JSON object) to an episode."""
        if not isinstance(action, dict):
            raise InvalidMemoryArgument("action", "must be a JSON object")
        _check_json("action", action)
        return self._append_to_episode(episode_id, "actions", action)

    def complete_episode(self, episode_id, *, success, final_output=None, error="", summary=""):
        """Close an episode: outcome, end time and duration (computed from its start)."""
        if not isinstance(success, bool):
            raise InvalidMemoryArgument("success", "must be true or false")
        _check_json("final_output", final_output)
        with transaction.atomic():
            episode = self._locked_episode(episode_id)
            episode.ended_at = timezone.now()
            episode.duration_ms = max(0, int((episode.ended_at - episode.started_at).total_seconds() * 1000))
            episode.success = success
            episode.final_output = final_output
            episode.error = _check_text("error", error, required=False)
            episode.summary = _check_text("summary", summary, required=False)
            episode.save(update_fields=["ended_at", "duration_ms", "success", "final_output", "error", "summary"])
            self._embed_for_recall(RecallKind.EPISODE, [episode.pk])
        return episode

    def get_episode(self, episode_id):
        try:
            return Episode.objects.get(pk=episode_id)
        except (Episode.DoesNotExist, ValueError, TypeError):
            raise MemoryNotFound("episode", episode_id) from None

    def recent_episodes(self, *, agent_id=None, user_id=None, limit=None):
        """The latest episodes of an agent and/or a user (following merges), newest first."""
        limit = _check_limit(limit, memory_settings.RECENT_EPISODES)
        if agent_id is not None:
            agent_id = _check_text("agent_id", agent_id, max_length=128)
        if user_id is not None:
            user_id = _check_user_id("user_id", user_id, required=True)
        return self.backend.recent_episodes(agent_id, user_id, limit)

    # ------------------------------------------------------------------ users

    def get_or_create_user(self, channel, external_id, *, display_name=""):
        """The memory user behind (channel, external id), created if new; returns (user, created).

        Follows merges to the surviving user. Safe when two requests meet a new user at once.
        """
        channel = _check_channel(channel)
        external_id = _check_text("external_id", str(external_id) if isinstance(external_id, int) else external_id, max_length=255)
        display_name = _check_text("display_name", display_name, required=False, max_length=200)
        user = self._user_by_identity(channel, external_id)
        if user is not None:
            return user, False
        try:
            with transaction.atomic():
                user = MemoryUser.objects.create(
                    canonical_id=f"{channel}:{external_id}", display_name=display_name, last_seen=timezone.now()
                )
                ChannelIdentity.objects.create(user=user, channel=channel, external_id=external_id)
            return user, True
        except IntegrityError:
            # Someone else created this identity (or this canonical id) first.
            user = self._user_by_identity(channel, external_id)
            if user is None:
                raise
            return user, False

    def _user_by_identity(self, channel, external_id):
        identity = (
            ChannelIdentity.objects.select_related("user__merged_into")
            .filter(channel=channel, external_id=external_id)
            .first()
        )
        if identity is None:
            return None
        return self._follow_merges(identity.user)

    def _follow_merges(self, user):
        seen = {user.pk}
        while user.merged_into_id is not None:
            nxt = user.merged_into if MemoryUser.merged_into.is_cached(user) else None
            if nxt is None:
                nxt = MemoryUser.objects.select_related("merged_into").get(pk=user.merged_into_id)
            if nxt.pk in seen:  # a cycle can only come from hand-edited rows; stop rather than spin
                break
            seen.add(nxt.pk)
            user = nxt
        return user

    def resolve_user(self, user_id):
        """The surviving user for `user_id`, following merges (chains too)."""
        user_id = _check_user_id("user_id", user_id, required=True)
        try:
            user = MemoryUser.objects.select_related("merged_into").get(pk=user_id)
        except MemoryUser.DoesNotExist:
            raise MemoryNotFound("memory user", user_id) from None
        return self._follow_merges(user)

    def link_identity(self, user_id, channel, external_id):
        """Attach another channel identity to a user; an identity of another user is an error."""
        user = self.resolve_user(user_id)
        channel = _check_channel(channel)
        external_id = _check_text("external_id", str(external_id) if isinstance(external_id, int) else external_id, max_length=255)
        current = self._user_by_identity(channel, external_id)
        if current is not None:
            if current.pk == user.pk:
                return ChannelIdentity.objects.get(channel=channel, external_id=external_id)
            raise InvalidMemoryArgument(
                "external_id", f"{channel}:{external_id} belongs to memory user {current.pk}; merge the users instead"
            )
        try:
            with transaction.atomic():
                return ChannelIdentity.objects.create(user=user, channel=channel, external_id=external_id)
        except IntegrityError:
            raise InvalidMemoryArgument("external_id", f"{channel}:{external_id} was just linked to another user") from None

    def merge_users(self, source_id, target_id):
        """Merge `source` into `target` in one transaction; returns the surviving user.

        Identities, user facts and episodes move to the target. For a key both users hold: the
        same value is kept once, confirmed by both; different values keep the more recently updated
        fact (the target's on a tie) and count one contradiction. Every user merged into the source
        now points at the target, so `merged_into` always names a surviving user.

        Concurrent merges touching the same users are serialised: both rows are locked in id order
        (no deadlock between two merges), and the survivors are resolved again once the locks are
        held, so a merge that raced another one (A->B while B->C, A->B while B->A) applies to the
        users as they are now, or is refused with MemoryConflict when nothing is left to merge.
        """
        source_id = _check_user_id("source_id", source_id, required=True)
        target_id = _check_user_id("target_id", target_id, required=True)
        for _ in range(_MERGE_ATTEMPTS):
            try:
                merged = self._merge_once(source_id, target_id)
            except OperationalError as exc:  # PostgreSQL: a deadlock with another writer of these rows
                if "deadlock" not in str(exc) or transaction.get_connection().in_atomic_block:
                    raise
                continue
            if merged is not None:
                return merged
        raise MemoryConflict("source_id", "the users kept changing under concurrent merges; try again")

    def _merge_once(self, source_id, target_id):
        """One attempt: the merged survivor, or None when a concurrent merge moved a user after it was read."""
        with transaction.atomic():
            source = self.resolve_user(source_id)
            target = self.resolve_user(target_id)
            if source.pk == target.pk:
                raise MemoryConflict("target_id", f"users {source_id} and {target_id} are already the same user")
            locked = {
                u.pk: u for u in MemoryUser.objects.select_for_update().filter(pk__in=(source.pk, target.pk)).order_by("pk")
            }
            if len(locked) < 2:
                gone = target_id if target.pk not in locked else source_id
                raise MemoryNotFound("memory user", gone)
            source, target = locked[source.pk], locked[target.pk]
            if source.merged_into_id is not None or target.merged_into_id is not None:
                return None  # merged meanwhile: nothing written yet; resolve again
            now = timezone.now()
            self._merge_user_facts(source, target)
            ChannelIdentity.objects.filter(user=source).update(user=target)
            Episode.objects.filter(user=source).update(user=target)
            MemoryUser.objects.filter(merged_into=source).update(merged_into=target)
            MemoryUser.objects.filter(pk=source.pk).update(merged_into=target, merged_at=now)
            MemoryUser.objects.filter(pk=target.pk).update(
                total_conversations=F("total_conversations") + source.total_conversations,
                display_name=target.display_name or source.display_name,
                last_seen=max(filter(None, [target.last_seen, source.last_seen]), default=None),
            )
            users_merged.send(sender=MemoryUser, source_id=source.pk, target_id=target.pk)
        target.refresh_from_db()
        return target

    def _merge_user_facts(self, source, target):
        target_facts = {f.key: f for f in Fact.objects.select_for_update().filter(user=target)}
        for fact in Fact.objects.select_for_update().filter(user=source, key__in=list(target_facts)):
            kept = target_facts[fact.key]
            if _same_json(kept.value, fact.value):
                Fact.objects.filter(pk=kept.pk).update(
                    times_confirmed=F("times_confirmed") + fact.times_confirmed + 1,
                    times_contradicted=F("times_contradicted") + fact.times_contradicted,
                    confidence=max(kept.confidence, fact.confidence),
                    access_count=F("access_count") + fact.access_count,
                )
                fact.delete()
            elif fact.updated_at > kept.updated_at:
                kept.delete()
                Fact.objects.filter(pk=fact.pk).update(
                    user=target, times_contradicted=F("times_contradicted") + 1
                )
            else:
                fact.delete()
                Fact.objects.filter(pk=kept.pk).update(times_contradicted=F("times_contradicted") + 1)
        Fact.objects.filter(user=source).update(user=target)

    def count_conversation(self, user_id):
        """Count one more conversation for a user and mark them seen now. One query."""
        user_id = _check_user_id("user_id", user_id, required=True)
        MemoryUser.objects.filter(pk=_survivor_id(user_id)).update(
            total_conversations=F("total_conversations") + 1, last_seen=timezone.now()
        )

    def user_context(self, user_id):
        """Display name, identities, preferences, facts, recent episodes and counts. Four queries."""
        user_id = _check_user_id("user_id", user_id, required=True)
        fact_count = Fact.objects.filter(user=OuterRef("pk")).order_by().values("user").annotate(n=Count("id")).values("n")
        episode_count = (
            Episode.objects.filter(user=OuterRef("pk")).order_by().values("user").annotate(n=Count("id")).values("n")
        )
        counted = MemoryUser.objects.annotate(
            fact_count=Coalesce(Subquery(fact_count), 0), episode_count=Coalesce(Subquery(episode_count), 0)
        )
        try:
            user = counted.get(pk=_survivor_id(user_id))
        except MemoryUser.DoesNotExist:
            raise MemoryNotFound("memory user", user_id) from None
        identities = ChannelIdentity.objects.filter(user=user).order_by("channel", "external_id")
        facts = list(Fact.objects.filter(user=user).order_by("-confidence", "key")[: memory_settings.CONTEXT_FACTS])
        episodes = list(Episode.objects.filter(user=user).order_by("-started_at", "-id")[: memory_settings.RECENT_EPISODES])
        return UserContext.of(
            user,
            identities,
            facts,
            episodes,
            fact_count=user.fact_count,
            episode_count=user.episode_count,
            total_conversations=user.total_conversations,
            last_seen=user.last_seen,
        )

    def conversation_count(self, user_id):
        return self.resolve_user(user_id).total_conversations

    # ------------------------------------------- identification, run episodes, user deletion

    def identify(self, channel, external_id, *, display_name=""):
        """The user behind (channel, external id) and their context, counting one more conversation.

        What a workflow's first node needs, in one transaction and at most four queries: the user's
        identities (with the user and fact/episode counts, following a merge), the conversation count
        (and a display name the user did not have yet), their facts, their recent episodes. A new user
        takes three: the lookup, the user, the identity. Safe when two requests meet a new user at once
        (the loser's insert is undone to a savepoint and it counts on the winner's user).
        """
        channel = _check_channel(channel)
        external_id = _check_text(
            "external_id", str(external_id) if isinstance(external_id, int) else external_id, max_length=255
        )
        display_name = _check_text("display_name", display_name, required=False, max_length=200)
        with transaction.atomic():
            found = self._identified(channel, external_id, display_name)
            if found is not None:
                return found
            now = timezone.now()
            try:
                with transaction.atomic():  # a savepoint: losing a race undoes only this part
                    user = MemoryUser.objects.create(
                        canonical_id=f"{channel}:{external_id}",
                        display_name=display_name,
                        total_conversations=1,
                        last_seen=now,
                    )
                    ChannelIdentity.objects.create(user=user, channel=channel, external_id=external_id)
            except IntegrityError:
                # Someone else created this identity (or this canonical id) first: count ours on theirs.
                found = self._identified(channel, external_id, display_name)
                if found is None:
                    raise
                return found
        context = UserContext(
            user_id=user.pk,
            canonical_id=user.canonical_id,
            display_name=user.display_name,
            identities=[{"channel": channel, "external_id": external_id}],
            preferences={},
            facts=[],
            recent_episodes=[],
            fact_count=0,
            episode_count=0,
            total_conversations=1,
            last_seen=now,
        )
        return Identified(context=context, created=True)

    def _identified(self, channel, external_id, display_name):
        user, identities = self.backend.identities_of(channel, external_id)
        if user is None:
            return None
        now = timezone.now()
        renamed = display_name if display_name and not user.display_name else None
        self.backend.count_visit(user.pk, now, renamed)
        if renamed:
            user = user._replace(display_name=renamed)
        facts, fact_count = self.backend.context_facts(user.pk, memory_settings.CONTEXT_FACTS)
        episodes, episode_count = self.backend.context_episodes(user.pk, memory_settings.RECENT_EPISODES)
        context = UserContext.of(
            user,
            identities,
            facts,
            episodes,
            fact_count=fact_count,
            episode_count=episode_count,
            total_conversations=user.total_conversations + 1,
            last_seen=now,
        )
        return Identified(context=context, created=False)

    def record_episode(
        self,
        *,
        started_at,
        agent_id="",
        user_id=None,
        session_id="",
        workflow="",
        trigger_type="",
        trigger_input=None,
        conversation=None,
        actions=None,
        final_output=None,
        success,
        error="",
        summary="",
    ):
        """Record a finished run as one episode, in one statement (under the surviving user of a merge)."""
        if not isinstance(started_at, datetime):
            raise InvalidMemoryArgument("started_at", "must be a datetime")
        if not isinstance(success, bool):
            raise InvalidMemoryArgument("success", "must be true or false")
        for name, value in (("conversation", conversation), ("actions", actions)):
            if value is not None and not isinstance(value, list):
                raise InvalidMemoryArgument(name, "must be a JSON array")
        user_id = _check_user_id("user_id", user_id, required=False)
        episode = Episode(
            agent_id=_check_text("agent_id", agent_id, required=False, max_length=128),
            session_id=_check_text("session_id", session_id, required=False, max_length=128),
            workflow=_check_text("workflow", workflow, required=False, max_length=128),
            trigger_type=_check_text("trigger_type", trigger_type, required=False, max_length=50),
            trigger_input=_check_json("trigger_input", {} if trigger_input is None else trigger_input),
            conversation=_check_json("conversation", conversation or []),
            actions=_check_json("actions", actions or []),
            final_output=_check_json("final_output", final_output),
            success=success,
            error=_check_text("error", error, required=False),
            summary=_check_text("summary", summary, required=False),
            started_at=started_at,
        )
        ended_at = timezone.now()
        episode.ended_at = ended_at
        episode.duration_ms = max(0, int((ended_at - started_at).total_seconds() * 1000))
        episode.user_id = user_id
        with transaction.atomic():
            if user_id is not None:
                self.backend.hold_user(user_id)
            self.backend.insert_episode(episode)
            if user_id is not None and episode.user_id is None:  # an unknown user: undo the insert
                raise InvalidMemoryArgument("user_id", f"no memory user with id {user_id}")
            self._embed_for_recall(RecallKind.EPISODE, [episode.pk])
        return episode

    def mark_episode_failed(self, episode_id, error):
        """Set an episode's outcome to failed with `error` (a write after the run went wrong)."""
        if not Episode.objects.filter(pk=episode_id).update(
            success=False, error=_check_text("error", error)
        ):
            raise MemoryNotFound("episode", episode_id)

    # ------------------------------------------------------------- procedures

    def save_procedure(
        self,
        name,
        *,
        agent_id="",
        description="",
        trigger_conditions=None,
        procedure_type=ProcedureType.PROMPT_TEMPLATE,
        content=None,
        source=ProcedureSource.HUMAN,
        parent_id=None,
        is_active=True,
    ):
        """Create the procedure `name` of an agent ("" = shared by all agents), or replace its definition."""
        name = _check_text("name", name, max_length=200)
        defaults = {
            "description": _check_text("description", description, required=False),
            "trigger_conditions": _check_trigger_conditions(trigger_conditions),
            "procedure_type": _check_choice("procedure_type", procedure_type, ProcedureType),
            "content": _check_json("content", {} if content is None else content),
            "source": _check_choice("source", source, ProcedureSource),
            "parent_id": _check_user_id("parent_id", parent_id, required=False),
            "is_active": bool(is_active),
        }
        agent_id = _check_text("agent_id", agent_id, required=False, max_length=128)
        parent = defaults["parent_id"]
        if parent is not None and not Procedure.objects.filter(pk=parent).exists():
            raise InvalidMemoryArgument("parent_id", f"no procedure with id {parent}")
        with transaction.atomic():
            procedure, created = Procedure.objects.update_or_create(agent_id=agent_id, name=name, defaults=defaults)
            self._embed_for_recall(RecallKind.PROCEDURE, [procedure.pk])
            if created:
                pruning.enforce_after_create(pruning.PROCEDURES, procedure)
        return procedure

    def get_procedure(self, name, *, agent_id=""):
        """The agent's own procedure `name`, else the shared one; None if neither exists."""
        name = _check_text("name", name, max_length=200)
        agent_id = _check_text("agent_id", agent_id, required=False, max_length=128)
        return Procedure.objects.filter(name=name, agent_id__in={agent_id, ""}).order_by("-agent_id").first()

    def find_procedure(self, goal, context=None, *, agent_id=""):
        """The best active procedure whose trigger conditions hold for this goal and context, or None.

        `goal_contains`: at least one listed word occurs in the goal (case-insensitive);
        `context_has`: every listed key is in the context. Matching happens in the database; the
        agent's own procedures and shared ones compete on smoothed success rate, then use.
        """
        found = self.matching_procedures(goal, context, agent_id=agent_id, limit=1)
        return found[0] if found else None

    def matching_procedures(self, goal, context=None, *, agent_id="", limit=3):
        """The best `limit` active procedures whose trigger conditions hold (see find_procedure)."""
        if not isinstance(goal, str):
            raise InvalidMemoryArgument("goal", "must be a string")
        goal = check_search("goal", goal, max_words=None, max_length=MAX_SEARCH_LENGTH)
        if context is not None and not isinstance(context, dict):
            raise InvalidMemoryArgument("context", "must be a JSON object")
        agent_id = _check_text("agent_id", agent_id, required=False, max_length=128)
        return self.backend.matching_procedures(goal, list(context or {}), agent_id, _check_limit(limit, 3))

    def record_procedure_use(self, procedure_id, *, success, duration_ms=None):
        """Count one use and its outcome; success rate and mean duration update in one statement."""
        if not isinstance(success, bool):
            raise InvalidMemoryArgument("success", "must be true or false")
        if duration_ms is not None and (
            isinstance(duration_ms, bool) or not isinstance(duration_ms, (int, float)) or duration_ms < 0
        ):
            raise InvalidMemoryArgument("duration_ms", "must be a non-negative number")
        won = 1 if success else 0
        used = Cast(F("times_used"), FloatField())
        changes = {
            "times_used": F("times_used") + 1,
            "times_succeeded": F("times_succeeded") + won,
            "times_failed": F("times_failed") + (1 - won),
            "success_rate": (Cast(F("times_succeeded"), FloatField()) + won) / (used + 1.0),
            "last_used": timezone.now(),
        }
        if duration_ms is not None:
            changes["avg_duration_ms"] = (F("avg_duration_ms") * used + float(duration_ms)) / (used + 1.0)
        if not Procedure.objects.filter(pk=procedure_id).update(**changes):
            raise MemoryNotFound("procedure", procedure_id)
        return Procedure.objects.get(pk=procedure_id)

    def deactivate_procedure(self, procedure_id):
        if not Procedure.objects.filter(pk=procedure_id).update(is_active=False):
            raise MemoryNotFound("procedure", procedure_id)

    def list_procedures(self, *, agent_id=None, active_only=False):
        qs = Procedure.objects.all()
        if agent_id is not None:
            qs = qs.filter(agent_id__in={_check_text("agent_id", agent_id, required=False, max_length=128), ""})
        if active_only:
            qs = qs.filter(is_active=True)
        return list(qs.order_by("name", "agent_id"))

    # ------------------------------------------------- operators: lists and batch deletes
    # Querysets for the /memories/ admin and the REST API (read only: filter, order, paginate them),
    # and deletes by id that are all-or-nothing and report the ids that did not exist.

    def fact_list(self):
        """Every fact, for operators (no visibility rules: staff see all owners)."""
        return Fact.objects.all()

    def episode_list(self):
        return Episode.objects.all()

    def procedure_list(self):
        return Procedure.objects.all()

    def memory_user_list(self):
        """Every memory user with `fact_count` and `episode_count`, identities prefetched."""
        return MemoryUser.objects.annotate(
            fact_count=Coalesce(Subquery(_count_by_user(Fact)), 0),
            episode_count=Coalesce(Subquery(_count_by_user(Episode)), 0),
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

    def delete_users(self, ids, *, cascade=False, max_ids=None, actor=""):
        """Delete memory users: "forget this person" with `cascade=True`.

        With `cascade`, everything that names them goes too, in one transaction: their facts,
        episodes, channel identities, the users merged into them, their recall events and admin log
        entries, the keyword indexes' copies of their words, and (through the `users_deleting`
        signal) their conversation threads and checkpoints; after the commit the database files let
        go of them too (memory/erasure.py). Without it, a user who still holds memories raises
        MemoryInUse naming the `cascade` field, and nothing is deleted. Either way an audit record
        (DeletionRecord: who, when, how many, which ids; never whose name) is written.
        `BatchDelete.cascaded` counts everything that went, threads and checkpoints included.
        """
        if not isinstance(cascade, bool):
            raise InvalidMemoryArgument("cascade", f"must be true or false, got {cascade!r}")
        ids = check_id_list(ids, max_ids)
        with transaction.atomic():
            found = _existing_ids(MemoryUser, ids)
            not_found = [i for i in ids if i not in found]
            if not found:
                return BatchDelete(0, not_found)
            footprint = self.user_footprint(found)
            held = {what: n for what, n in footprint.items() if n and what in _MEMORY_HELD}
            if not cascade and held:
                listed = ", ".join(f"{n} {what.replace('_', ' ')}" for what, n in held.items())
                raise MemoryInUse("cascade", f"the users still hold {listed}; pass cascade=true to delete them too")
            merged = set()
            for chunk in _chunks(sorted(found)):
                merged.update(MemoryUser.objects.filter(merged_into__in=chunk).values_list("pk", flat=True))
            everyone = sorted(found | merged)
            fact_ids, episode_ids = [], []
            for chunk in _chunks(everyone):
                fact_ids += Fact.objects.filter(user__in=chunk).values_list("pk", flat=True)
                episode_ids += Episode.objects.filter(user__in=chunk).values_list("pk", flat=True)
            # Always: without cascade the users hold no memories, but may still have threads.
            users_deleting.send(sender=MemoryUser, user_ids=everyone)
            erasure.erase_related(everyone, fact_ids, episode_ids)
            for chunk in _chunks(everyone):
                Fact.objects.filter(user__in=chunk).delete()
                Episode.objects.filter(user__in=chunk).delete()  # derived facts of others keep, unlinked
                ChannelIdentity.objects.filter(user__in=chunk).delete()
            for chunk in _chunks(everyone):
                MemoryUser.objects.filter(merged_into__in=chunk).update(merged_into=None)
            for chunk in _chunks(everyone):
                MemoryUser.objects.filter(pk__in=chunk).delete()
            erasure.purge_indexes(self.backend, everyone)
            _record_deletion(actor, DeletionKind.MEMORY_USERS, sorted(found), footprint)
            erasure.scrub_after_commit()
        return BatchDelete(len(found), not_found, cascaded=footprint if cascade else {})

    def user_footprint(self, ids):
        """How much these users (and users merged into them) hold, by kind, threads and checkpoints included.

        Facts, episodes, identities, merged users, recall events; other apps add theirs through the
        `users_footprint` signal (workflows: threads and checkpoints).
        """
        ids = sorted(set(ids))
        totals = {"facts": 0, "episodes": 0, "identities": 0, "merged_users": 0, "recall_events": 0}
        for chunk in _chunks(ids):
            totals["facts"] += Fact.objects.filter(user__in=chunk).count()
            totals["episodes"] += Episode.objects.filter(user__in=chunk).count()
            totals["identities"] += ChannelIdentity.objects.filter(user__in=chunk).count()
            totals["merged_users"] += MemoryUser.objects.filter(merged_into__in=chunk).count()
            totals["recall_events"] += RecallEvent.objects.filter(user_id__in=chunk).count()
        for _, counts in users_footprint.send(sender=MemoryUser, user_ids=ids):
            for what, n in (counts or {}).items():
                totals[what] = totals.get(what, 0) + n
        return totals

    def record_deletion(self, actor, kind, ids, cascaded=None):
        """Write the audit record of a deletion another app made (threads), in the caller's transaction."""
        _record_deletion(actor, _check_choice("kind", kind, DeletionKind), list(ids), cascaded)

    def export_person(self, user_id, out):
        """Everything Engram holds about one person, as JSON Lines on `out` (a subject access request).

        One object per line, each with a "kind": the user (and users merged into them), identities,
        facts, episodes, recall events, and what other apps keep (threads and their messages, through
        the `person_exporting` signal). Returns how many lines were written.
        """
        user = self.resolve_user(user_id)
        return erasure.export_person(user, out)

    def _batch_delete(self, model, ids, max_ids, actor, kind):
        ids = check_id_list(ids, max_ids)
        with transaction.atomic():
            found = _existing_ids(model, ids)
            if model is Fact:
                erasure.erase_related((), sorted(found), ())
            elif model is Episode:
                erasure.erase_related((), (), sorted(found))
            # One set-based DELETE per chunk: a model nothing points at (facts) is deleted without
            # loading rows; rows that point here with SET_NULL are cleared by one UPDATE per chunk.
            for chunk in _chunks(sorted(found)):
                model.objects.filter(pk__in=chunk).delete()
            if found:
                _record_deletion(actor, kind, sorted(found))
        return BatchDelete(len(found), [i for i in ids if i not in found])

    # ---------------------------------------------------------- consolidation

    def consolidate(self, **kwargs):
        """Distil unprocessed episodes into facts; see memory.consolidation.run_consolidation."""
        from .consolidation import run_consolidation

        return run_consolidation(service=self, **kwargs)

    def unconsolidated_episodes(self, *, limit, agent_id=None, episode_ids=None):
        """Finished episodes not yet processed for facts, oldest first (one agent's, or the given ids)."""
        limit = _check_limit(limit, None)
        qs = Episode.objects.filter(processed_for_facts=False, ended_at__isnull=False)
        if agent_id is not None:
            qs = qs.filter(agent_id=_check_text("agent_id", agent_id, required=False, max_length=128))
        if episode_ids is not None:
            qs = qs.filter(pk__in=[_check_user_id("episode_ids", pk, required=True) for pk in episode_ids])
        return list(qs.order_by("started_at", "id")[:limit])

    def store_consolidated_facts(self, episode_id, facts, *, overwrite=True, provenance="consolidation"):
        """Write the facts distilled from one episode, then mark it processed, in one transaction.

        `facts`: set_fact keyword dicts (key, value, scope and owner, fact_type, confidence). Returns
        the writes, or None when the episode was processed by someone else meanwhile (nothing is then
        written). Any failing write rolls everything back and leaves the episode unprocessed. A fact
        whose stored version changed after the episode began is left as it is (`kept_newer`): the
        run's own remember node stored it, or a later conversation said something newer.
        """
        episode = self.get_episode(episode_id)
        with transaction.atomic():
            writes = []
            for fact in facts:
                stored = self._stored_fact(fact)
                if stored is not None and self._said_since(stored, episode, provenance):
                    writes.append(FactWrite(WriteAction.KEPT_NEWER, stored))
                    continue
                writes.append(
                    self.set_fact(**fact, overwrite=overwrite, source_episode_id=episode_id, provenance=provenance)
                )
            marked = Episode.objects.filter(pk=episode_id, processed_for_facts=False).update(processed_for_facts=True)
            if not marked:
                transaction.set_rollback(True)
                return None
        return writes

    def _said_since(self, fact, episode, provenance):
        """Whether `fact` holds what was said in `episode` or after it (not by consolidation replaying)."""
        if fact.source_episode_id == episode.pk:
            return True  # the run stored it itself (its remember node)
        if fact.source_episode_id is not None:
            source = Episode.objects.filter(pk=fact.source_episode_id).values_list("started_at", flat=True).first()
            return source is not None and source > episode.started_at
        return fact.updated_at >= episode.started_at and fact.provenance != provenance

    def _stored_fact(self, arguments):
        """The fact set_fact(**arguments) would write to, as stored now (None when there is none)."""
        probe = self._new_fact(
            arguments["key"], arguments["value"], arguments.get("scope", Scope.GLOBAL), arguments.get("agent_id", ""),
            arguments.get("user_id"), arguments.get("session_id", ""), None, None, None, "",
        )
        return self.backend.owned_fact(probe, lock=True)

    def record_consolidation_run(self, report):
        """Store a run's outcome (what /healthz shows as the last consolidation); returns its id."""
        run = ConsolidationRun.objects.create(
            started_at=report.started_at,
            finished_at=report.finished_at or timezone.now(),
            extractor=report.extractor[:200],
            agent_id=report.agent_id,
            episodes_seen=report.episodes_seen,
            episodes_processed=len(report.processed),
            episodes_failed=len(report.failed),
            facts_created=report.actions.get(WriteAction.CREATED, 0),
            facts_confirmed=report.actions.get(WriteAction.CONFIRMED, 0),
            facts_updated=report.actions.get(WriteAction.UPDATED, 0),
            facts_skipped=report.actions.get(WriteAction.SKIPPED, 0),
            errors=[*report.errors, *(f"episode {pk}: {err}" for pk, err in report.failed.items())],
        )
        return run.pk

    def last_consolidation(self):
        """The latest recorded consolidation run, or None."""
        return ConsolidationRun.objects.order_by("-started_at", "-id").first()

    # ------------------------------------------------------ limits and pruning

    def prune(self, *, agent_id=None, dry_run=False):
        """Bring memory within MEMORY["LIMITS"] (every agent, or one), let other apps prune, reclaim space.

        Returns a PruneReport; see memory.pruning for what goes first.
        """
        if agent_id is not None:
            agent_id = _check_text("agent_id", agent_id, required=False, max_length=128)
        return pruning.prune_all(agent_id=agent_id, dry_run=bool(dry_run))

    # ------------------------------------------------- export, import, clear

    def export_memories(self, out, *, on_progress=None):
        """Write every memory row as JSON Lines to the text stream `out`; returns {kind: rows}.

        See memory.transfer for the format. `on_progress(kind, done, total)` is called as rows go out.
        """
        from . import transfer

        self.flush_access_counts()  # the export carries the counts recalls have noted so far
        return transfer.export(out, on_progress=on_progress)

    def import_memories(self, stream, *, dry_run=False, on_progress=None):
        """Validate a whole export, then add its new rows in one transaction; returns an ImportReport.

        `stream`: a seekable text stream. Raises ImportRejected (naming line and field) and writes
        nothing when anything is wrong. Rows whose id exists are left as stored.
        """
        from . import transfer

        return transfer.import_(stream, dry_run=dry_run, on_progress=on_progress)

    def clear_memories(self, kinds=None, *, scope=None, agent_id=None, user_id=None, actor="command"):
        """Delete memory by kind (facts, episodes, procedures, users), scope, agent or user, atomically.

        Returns {kind: rows deleted}. See memory.clearing for what each filter selects.
        """
        from . import clearing

        if scope is not None:
            scope = _check_choice("scope", scope, Scope)
        if agent_id is not None:
            agent_id = _check_text("agent_id", agent_id, max_length=128)
        if user_id is not None:
            user_id = self.resolve_user(user_id).pk
        if kinds is not None and (isinstance(kinds, str) or not all(isinstance(k, str) for k in kinds)):
            raise InvalidMemoryArgument("kinds", "must be a list of kind names")
        self.flush_access_counts()
        return clearing.clear(kinds, scope=scope, agent_id=agent_id, user_id=user_id, actor=actor)

    # ------------------------------------------------------------ operators

    LIST_KINDS = ("facts", "episodes", "procedures", "users")

    def list_memories(self, kind="facts", *, scope=None, agent_id=None, user_id=None, category=None, limit=20):
        """Rows of one kind for operators, newest first, filtered; `category` is the fact type, the
        episode's trigger type, the procedure type or the user's channel. Returns model instances."""
        if kind not in self.LIST_KINDS:
            raise InvalidMemoryArgument("kind", f"must be one of {', '.join(self.LIST_KINDS)}; got {kind!r}")
        limit = _check_limit(limit, 20)
        given = {"scope": scope, "agent_id": agent_id, "user_id": user_id}
        allowed = {"facts": {"scope", "agent_id", "user_id"}, "episodes": {"agent_id", "user_id"},
                   "procedures": {"agent_id"}, "users": {"user_id"}}[kind]
        for name, value in given.items():
            if value is not None and name not in allowed:
                raise InvalidMemoryArgument(name, f"does not apply to {kind}")
        if user_id is not None:
            user_id = self.resolve_user(user_id).pk
        if agent_id is not None:
            agent_id = _check_text("agent_id", agent_id, required=False, max_length=128)
        if kind == "facts":
            qs = Fact.objects.select_related("user").order_by("-updated_at", "-id")
            if scope is not None:
                qs = qs.filter(scope=_check_choice("scope", scope, Scope))
            if agent_id is not None:
                qs = qs.filter(agent_id=agent_id)
            if user_id is not None:
                qs = qs.filter(user_id=user_id)
            if category is not None:
                qs = qs.filter(fact_type=_check_choice("category", category, FactType))
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
                qs = qs.filter(procedure_type=_check_choice("category", category, ProcedureType))
        else:
            qs = MemoryUser.objects.filter(merged_into__isnull=True).order_by("-last_seen", "-id")
            if user_id is not None:
                qs = qs.filter(pk=user_id)
            if category is not None:
                qs = qs.filter(identities__channel=category).distinct()
        return list(qs[:limit])

    # ------------------------------------------------------------------ health

    def memory_health(self, *, agent_id=None, fresh=True):
        """Seed 001's five metrics, score and colour band (of one agent, or all); see memory.health.

        `fresh=False` may return a result up to HEALTH["CACHE_SECONDS"] old.
        """
        from . import health

        if agent_id is not None:
            agent_id = _check_text("agent_id", agent_id, max_length=128)
        if not fresh:
            return health.cached(agent_id)
        self.flush_access_counts()  # efficiency counts recalls still buffered
        return health.compute(agent_id)

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


def _same_json(a, b):
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _check_trigger_conditions(conditions):
    """{"goal_contains": [words], "context_has": [keys]}; empty lists are dropped (no condition)."""
    if conditions is None:
        return {}
    if not isinstance(conditions, dict):
        raise InvalidMemoryArgument("trigger_conditions", "must be a JSON object")
    unknown = set(conditions) - {"goal_contains", "context_has"}
    if unknown:
        raise InvalidMemoryArgument(
            "trigger_conditions", f"unknown condition(s) {sorted(unknown)}; use goal_contains, context_has"
        )
    cleaned = {}
    for name, items in conditions.items():
        if not isinstance(items, list) or not all(isinstance(i, str) and i.strip() for i in items):
            raise InvalidMemoryArgument("trigger_conditions", f"{name} must be a list of non-empty strings")
        if items:
            cleaned[name] = [i.strip().lower() if name == "goal_contains" else i.strip() for i in items]
    return cleaned


# ------------------------------------------------- operators: batch delete helpers

# Ids per statement: well under every database's bound-parameter limit.
_ID_CHUNK = 900
# The largest id a BigAutoField holds; a larger one cannot name a row (and would overflow the driver).
MAX_ID = 2**63 - 1


@dataclass(frozen=True)
class BatchDelete:
    """What a batch delete did: how many rows went, which requested ids did not exist."""

    deleted: int
    not_found: list[int]
    cascaded: dict[str, int] = field(default_factory=dict)


def _is_row_id(ident):
    return not isinstance(ident, bool) and isinstance(ident, int) and 0 < ident <= MAX_ID


def check_id_list(ids, max_ids=None, *, noun="id", valid=_is_row_id, expected=f"a positive integer id up to {MAX_ID}"):
    """A non-empty list of ids, each passing `valid` (duplicates dropped, order kept), at most
    `max_ids`; errors name `ids` or `ids[i]`. Other apps' batch deletes use it with their own ids."""
    if isinstance(ids, (str, bytes, dict)) or not hasattr(ids, "__iter__"):
        raise InvalidMemoryArgument("ids", f"must be a list of {noun}s, got {type(ids).__name__}")
    ids = list(ids)
    if not ids:
        raise InvalidMemoryArgument("ids", f"must name at least one {noun}")
    if max_ids is not None and len(ids) > max_ids:
        raise InvalidMemoryArgument("ids", f"at most {max_ids} ids per call, got {len(ids)}")
    for n, ident in enumerate(ids):
        if not valid(ident):
            raise InvalidMemoryArgument(f"ids[{n}]", f"must be {expected}, got {ident!r}")
    return list(dict.fromkeys(ids))




def _chunks(items, size=_ID_CHUNK):
    items = list(items)
    for start in range(0, len(items), size):
        yield items[start : start + size]


# What makes a user "in use" for a delete without cascade: memories, not statistics or threads.
_MEMORY_HELD = ("facts", "episodes", "identities", "merged_users")


def _record_deletion(actor, kind, ids, cascaded=None):
    """The audit record of one deletion (in its transaction): ids and counts, never a name."""
    DeletionRecord.objects.create(
        actor=(str(actor).strip() or "code")[:200], kind=kind, count=len(ids), ids=list(ids), cascaded=cascaded or {}
    )


def _existing_ids(model, ids):
    found = set()
    for chunk in _chunks(ids):
        found.update(model._base_manager.filter(pk__in=chunk).values_list("pk", flat=True))
    return found


def _count_by_user(model):
    return model.objects.filter(user=OuterRef("pk")).order_by().values("user").annotate(n=Count("id")).values("n")
