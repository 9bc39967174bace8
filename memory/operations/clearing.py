"""Clearing memory by kind, scope, agent or user, in one transaction; internal to MemoryService.clear_memories().

Kinds: facts, episodes, procedures, users (a user goes with its channel identities, facts and
episodes, and with the users merged into it). Filters narrow each kind they apply to: `scope` facts
only; `agent_id` an agent's own facts, its episodes and procedures; `user_id` a user's facts and
episodes, and the user. Without kinds, every kind the filters apply to. Facts distilled from a
deleted episode stay, without their source episode. Clearing facts clears their history too (the
versions of the owners the filters select, deleted facts' included): clearing starts over, where a
delete of chosen facts keeps a `deleted` version of each.
"""

from django.db import transaction

from ..exceptions import InvalidMemoryArgument
from ..models import Episode, Fact, FactVersion, MemoryUser, Procedure, Scope

FACTS, EPISODES, PROCEDURES, USERS = "facts", "episodes", "procedures", "users"
KINDS = (FACTS, EPISODES, PROCEDURES, USERS)
# Which filters each kind understands.
_APPLIES = {
    FACTS: {"scope", "agent_id", "user_id"},
    EPISODES: {"agent_id", "user_id"},
    PROCEDURES: {"agent_id"},
    USERS: {"user_id"},
}


def _delete(qs):
    """Delete the rows of a queryset; returns how many of its model went.

    QuerySet.delete, not a hand-written DELETE ... IN (subquery): that was faster in bench.lifecycle's
    clear, but not by enough to justify leaving the ORM.
    """
    _, per_model = qs.delete()
    return per_model.get(qs.model._meta.label, 0)


def plan_kinds(kinds, filters):
    """The kinds to clear, checked against the filters given; InvalidMemoryArgument names the misfit."""
    given = {name for name, value in filters.items() if value not in (None, "")}
    if kinds is None:
        chosen = [k for k in KINDS if given <= _APPLIES[k]] if given else list(KINDS)
        if not chosen:
            raise InvalidMemoryArgument(
                "scope", "scope applies to facts only and cannot be combined with user_id and agent_id"
            )
        return chosen
    chosen = []
    for kind in kinds:
        if kind not in KINDS:
            raise InvalidMemoryArgument("kinds", f"unknown kind {kind!r}; use {', '.join(KINDS)}")
        misfit = given - _APPLIES[kind]
        if misfit:
            raise InvalidMemoryArgument(sorted(misfit)[0], f"does not apply to {kind}")
        chosen.append(kind)
    return chosen


def clear(service, kinds, *, scope=None, agent_id=None, user_id=None, actor="command"):
    """Delete what the filters select (people through `service.delete_users`); returns {kind: rows deleted}
    (identities counted apart)."""
    filters = {"scope": scope, "agent_id": agent_id, "user_id": user_id}
    chosen = plan_kinds(kinds, filters)
    if scope and (agent_id and scope != Scope.AGENT or user_id is not None and scope != Scope.USER):
        raise InvalidMemoryArgument(
            "scope", f"{scope} facts have no {'agent' if agent_id else 'user'}; leave scope out"
        )
    if agent_id and user_id is not None and FACTS in chosen:
        raise InvalidMemoryArgument("user_id", "a fact belongs to an agent or a user, not both; clear them apart")
    deleted = {}
    with transaction.atomic():
        if FACTS in chosen:
            facts, versions = Fact.objects.all(), FactVersion.objects.all()
            if scope:
                facts, versions = facts.filter(scope=scope), versions.filter(scope=scope)
            if agent_id:
                facts = facts.filter(scope=Scope.AGENT, agent_id=agent_id)
                versions = versions.filter(scope=Scope.AGENT, agent_id=agent_id)
            if user_id is not None:
                facts, versions = facts.filter(user_id=user_id), versions.filter(user_id=user_id)
            _delete(versions)
            deleted[FACTS] = _delete(facts)
        if EPISODES in chosen:
            episodes = Episode.objects.all()
            if agent_id:
                episodes = episodes.filter(agent_id=agent_id)
            if user_id is not None:
                episodes = episodes.filter(user_id=user_id)
            deleted[EPISODES] = _clear_episodes(episodes)
        if PROCEDURES in chosen:
            procedures = Procedure.objects.filter(agent_id=agent_id) if agent_id else Procedure.objects.all()
            Procedure.objects.filter(parent__in=procedures).exclude(pk__in=procedures).update(parent=None)
            deleted[PROCEDURES] = _delete(procedures)
        if USERS in chosen:
            # Forgetting people is one path (MemoryService.delete_users): their rows, what names them
            # elsewhere (recall events, admin log, index copies, threads), the audit record.
            users = MemoryUser.objects.all()
            if user_id is not None:
                users = users.filter(pk=user_id) | users.filter(merged_into_id=user_id)
            doomed = list(users.values_list("pk", flat=True))
            if doomed:
                # Clearing every user is a reset (export, clear, import restores it): no tombstones.
                # Clearing one person is forgetting them: a tombstone, as with every other path.
                result = service.delete_users(doomed, cascade=True, actor=actor, tombstone=user_id is not None)
                deleted[FACTS] = deleted.get(FACTS, 0) + result.cascaded.get("facts", 0)
                deleted[EPISODES] = deleted.get(EPISODES, 0) + result.cascaded.get("episodes", 0)
                deleted["identities"] = result.cascaded.get("identities", 0)
            deleted[USERS] = len(doomed)
    return deleted


def _clear_episodes(episodes):
    Fact.objects.filter(source_episode__in=episodes).update(source_episode=None)
    return _delete(episodes)
