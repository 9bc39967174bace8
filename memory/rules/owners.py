"""A user's owner key inside a query, following merges (the key itself: memory/models/owners.py), and
the team a team-scoped fact or call names."""

from django.db.models import CharField, Subquery, Value
from django.db.models.functions import Cast, Coalesce, Concat

from ..exceptions import InvalidMemoryArgument
from ..models import MemoryUser, Scope, Team, TeamMember
from ..models.owners import owner_prefix
from .validation import check_int, clean_text


def survivor_id(user_id):
    """The id of the user `user_id` was merged into, or `user_id` itself, inside the query.

    Merges keep `merged_into` pointing at the surviving user (never at another merged user), so one
    hop is enough and a lookup by a stale id stays one query.
    """
    merged_into = Subquery(MemoryUser.objects.filter(pk=user_id).order_by().values("merged_into_id")[:1])
    return Coalesce(merged_into, Value(user_id))


def user_scope_key(user_id):
    """The owner key of `user_id`'s survivor, inside the query."""
    return Concat(Value(owner_prefix(Scope.USER)), Cast(survivor_id(user_id), CharField()))


def find_team(field_name, team):
    """The Team named `team` (or with that id, given a number), else InvalidMemoryArgument naming the field."""
    if isinstance(team, Team):
        return team
    if isinstance(team, int) and not isinstance(team, bool):
        found = Team.objects.filter(pk=check_int(field_name, team, minimum=1)).first()
    else:
        found = Team.objects.filter(name=clean_text(field_name, team, max_length=128)).first()
    if found is None:
        raise InvalidMemoryArgument(field_name, f"no team {team!r}")
    return found


def check_member(team, agent_id, field_name="agent_id"):
    """InvalidMemoryArgument naming `field_name` unless agent `agent_id` is a member of `team`."""
    if not TeamMember.objects.filter(team=team, agent_id=agent_id).exists():
        raise InvalidMemoryArgument(field_name, f"agent {agent_id!r} is not a member of team {team.name!r}")
