"""Memory users: one person across channels, identified, merged and described. MemoryService delegates to it."""

from dataclasses import dataclass, field
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from django.db import IntegrityError, OperationalError, transaction
from django.db.models import Count, F, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from ..conf import memory_settings
from ..exceptions import InvalidMemoryArgument, MemoryConflict, MemoryNotFound
from ..models import ChannelIdentity, Episode, Fact, FactAction, FactType, FactVersion, MemoryUser, Scope
from ..models.owners import owner_key
from ..rules.owners import survivor_id
from ..rules.validation import check_channel, check_external_id, check_user_id, clean_text
from ..signals import users_merged
from . import history
from .facts import same_json

# Attempts of a merge that keeps meeting concurrent merges of the same users before it gives up.
_MERGE_ATTEMPTS = 5


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
                    "summary": e.gist,
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


class Users:
    """Memory users, their identities, merges and context; MemoryService builds it and delegates."""

    def __init__(self, backend):
        self.backend = backend

    def get_or_create_user(self, channel, external_id, *, display_name=""):
        """The memory user behind (channel, external id), created if new; returns (user, created).

        Follows merges to the surviving user. Safe when two requests meet a new user at once.
        """
        channel = check_channel(channel)
        external_id = check_external_id(external_id)
        display_name = clean_text("display_name", display_name, required=False, max_length=200)
        user = self.user_by_identity(channel, external_id)
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
            user = self.user_by_identity(channel, external_id)
            if user is None:
                raise _canonical_id_taken(channel, external_id) from None
            return user, False

    def find_user(self, channel, external_id):
        """The memory user behind (channel, external id), following merges; None if that identity is
        unknown. Nothing is created (a preview of what a run would see must not make a person)."""
        return self.user_by_identity(check_channel(channel), check_external_id(external_id))

    def user_by_identity(self, channel, external_id):
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
        user_id = check_user_id("user_id", user_id, required=True)
        try:
            user = MemoryUser.objects.select_related("merged_into").get(pk=user_id)
        except MemoryUser.DoesNotExist:
            raise MemoryNotFound("memory user", user_id) from None
        return self._follow_merges(user)

    def link_identity(self, user_id, channel, external_id):
        """Attach another channel identity to a user; an identity of another user is an error."""
        user = self.resolve_user(user_id)
        channel = check_channel(channel)
        external_id = check_external_id(external_id)
        current = self.user_by_identity(channel, external_id)
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
            raise InvalidMemoryArgument(
                "external_id", f"{channel}:{external_id} was just linked to another user"
            ) from None

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
        source_id = check_user_id("source_id", source_id, required=True)
        target_id = check_user_id("target_id", target_id, required=True)
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
                u.pk: u
                for u in MemoryUser.objects.select_for_update().filter(pk__in=(source.pk, target.pk)).order_by("pk")
            }
            if len(locked) < 2:
                gone = target_id if target.pk not in locked else source_id
                raise MemoryNotFound("memory user", gone)
            source, target = locked[source.pk], locked[target.pk]
            if source.merged_into_id is not None or target.merged_into_id is not None:
                return None  # merged meanwhile: nothing written yet; resolve again
            now = timezone.now()
            self._merge_user_facts(source, target, now)
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

    def _merge_user_facts(self, source, target, now):
        merge = SimpleNamespace(provenance=f"merge of memory user {source.pk}", source_episode_id=None)
        target_facts = {f.key: f for f in Fact.objects.select_for_update().filter(user=target)}
        clashing = list(Fact.objects.select_for_update().filter(user=source, key__in=list(target_facts)))
        # A key both held: both facts' states so far stay in history (the one dropped ends without a
        # `deleted` version: its key lives on); the one kept gets the merge as its current change.
        history.supersede([f.pk for f in clashing] + [target_facts[f.key].pk for f in clashing])
        # History moves with the facts: the source's versions (deleted facts' included) become the
        # target's, so a read as of before the merge by either id answers what that person held.
        FactVersion.objects.filter(user=source).update(user=target, scope_key=owner_key(Scope.USER, user_id=target.pk))
        for fact in clashing:
            kept = target_facts[fact.key]
            if same_json(kept.value, fact.value):
                action, survivor, dropped = FactAction.CONFIRMED, kept, fact
                changes = {
                    "times_confirmed": F("times_confirmed") + fact.times_confirmed + 1,
                    "times_contradicted": F("times_contradicted") + fact.times_contradicted,
                    "confidence": max(kept.confidence, fact.confidence),
                    "access_count": F("access_count") + fact.access_count,
                }
            elif fact.updated_at > kept.updated_at:
                action, survivor, dropped = FactAction.UPDATED, fact, kept
                changes = {"user": target, "times_contradicted": F("times_contradicted") + 1}
            else:
                action, survivor, dropped = FactAction.SKIPPED, kept, fact
                changes = {"times_contradicted": F("times_contradicted") + 1}
            dropped.delete()  # first: the survivor may take its owner and key
            Fact.objects.filter(pk=survivor.pk).update(
                updated_at=now, **changes, **history.change_columns(action, merge)
            )
        Fact.objects.filter(user=source).update(user=target)

    def count_conversation(self, user_id):
        """Count one more conversation for a user and mark them seen now. One query."""
        user_id = check_user_id("user_id", user_id, required=True)
        MemoryUser.objects.filter(pk=survivor_id(user_id)).update(
            total_conversations=F("total_conversations") + 1, last_seen=timezone.now()
        )

    def user_context(self, user_id):
        """Display name, identities, preferences, facts, recent episodes and counts. Four queries."""
        user_id = check_user_id("user_id", user_id, required=True)
        fact_count = (
            Fact.objects.filter(user=OuterRef("pk")).order_by().values("user").annotate(n=Count("id")).values("n")
        )
        episode_count = (
            Episode.objects.filter(user=OuterRef("pk")).order_by().values("user").annotate(n=Count("id")).values("n")
        )
        counted = MemoryUser.objects.annotate(
            fact_count=Coalesce(Subquery(fact_count), 0), episode_count=Coalesce(Subquery(episode_count), 0)
        )
        try:
            user = counted.get(pk=survivor_id(user_id))
        except MemoryUser.DoesNotExist:
            raise MemoryNotFound("memory user", user_id) from None
        identities = ChannelIdentity.objects.filter(user=user).order_by("channel", "external_id")
        now = timezone.now()  # facts that hold now (valid time), as identify lists them
        holding = (Q(valid_from__isnull=True) | Q(valid_from__lte=now)) & (
            Q(valid_to__isnull=True) | Q(valid_to__gt=now)
        )
        facts = list(
            Fact.objects.filter(holding, user=user).order_by("-confidence", "key")[: memory_settings.CONTEXT_FACTS]
        )
        episodes = list(
            Episode.objects.filter(user=user).order_by("-started_at", "-id")[: memory_settings.RECENT_EPISODES]
        )
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

    def channel_identities(self, user_ids, channels=None):
        """(user id, channel, external id) of these users' identities, the newest first; only `channels` if given."""
        rows = ChannelIdentity.objects.filter(user_id__in=list(user_ids)).order_by("-created_at", "-pk")
        if channels is not None:
            rows = rows.filter(channel__in=list(channels))
        return list(rows.values_list("user_id", "channel", "external_id"))

    def conversation_count(self, user_id):
        return self.resolve_user(user_id).total_conversations

    def identify(self, channel, external_id, *, display_name=""):
        """The user behind (channel, external id) and their context, counting one more conversation.

        What a workflow's first node needs, in one transaction and at most four queries: the user's
        identities (with the user and fact/episode counts, following a merge), the conversation count
        (and a display name the user did not have yet), their facts, their recent episodes. A new user
        takes three: the lookup, the user, the identity. Safe when two requests meet a new user at once
        (the loser's insert is undone to a savepoint and it counts on the winner's user).
        """
        channel = check_channel(channel)
        external_id = check_external_id(external_id)
        display_name = clean_text("display_name", display_name, required=False, max_length=200)
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
                    raise _canonical_id_taken(channel, external_id) from None
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


def _canonical_id_taken(channel, external_id):
    """The error of a new person whose identity no one has but whose canonical id ("channel:id",
    unique in a workspace) another person of this workspace holds: one whose identity was moved to
    someone else by a merge or a relink."""
    return MemoryConflict("external_id", f"{channel}:{external_id} is the canonical id of another person")
