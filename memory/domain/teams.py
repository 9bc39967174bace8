"""Teams: named groups of agents that share facts (scope "team", between the agent's own and global
in the lookup order). MemoryService delegates to it.

A member sees its teams' facts in every read (get_fact, search_facts, list_facts, recall): the reads
find them through the membership table inside their one query. Team facts are no person's: forgetting
a person leaves them; deleting a team deletes its facts (each keeps a `deleted` history version).
"""

from django.db import IntegrityError, transaction

from ..exceptions import InvalidMemoryArgument, MemoryNotFound
from ..models import DeletionKind, Fact, Team, TeamMember
from ..rules.owners import find_team
from ..rules.validation import check_id_list, clean_text
from . import history
from .deletions import BatchDelete, write_deletion_record

MAX_TEAM_MEMBERS = 1000


def _agent_ids(field_name, agent_ids):
    if isinstance(agent_ids, str) or not isinstance(agent_ids, list | tuple | set):
        raise InvalidMemoryArgument(field_name, "must be a list of agent ids")
    if len(agent_ids) > MAX_TEAM_MEMBERS:
        raise InvalidMemoryArgument(field_name, f"has {len(agent_ids)} agents; a team takes at most {MAX_TEAM_MEMBERS}")
    cleaned = [clean_text(field_name, a, max_length=128) for a in agent_ids]
    return sorted(set(cleaned))


class Teams:
    """Teams and their members; MemoryService builds it and delegates."""

    def __init__(self, backend):
        self.backend = backend

    def create_team(self, name, *, agent_ids=(), description=""):
        """A new team of these agents. InvalidMemoryArgument "name" if the name is taken or blank."""
        name = clean_text("name", name, max_length=128)
        description = clean_text("description", description, required=False)
        agents = _agent_ids("agent_ids", agent_ids)
        try:
            with transaction.atomic():
                team = Team.objects.create(name=name, description=description)
                TeamMember.objects.bulk_create([TeamMember(team=team, agent_id=a) for a in agents])
        except IntegrityError:
            if Team.objects.filter(name=name).exists():
                raise InvalidMemoryArgument("name", f"a team named {name!r} exists already") from None
            raise
        return team

    def get_team(self, team):
        """The team named `team` (or with that id); InvalidMemoryArgument "team" if there is none."""
        return find_team("team", team)

    def teams(self, *, agent_id=None):
        """Every team by name, or (`agent_id`) the teams that agent is a member of."""
        qs = Team.objects.all()
        if agent_id is not None:
            qs = qs.filter(members__agent_id=clean_text("agent_id", agent_id, max_length=128))
        return qs.order_by("name")

    def team_list(self):
        """Every team with its members prefetched, for operators (the admin, the REST API)."""
        return Team.objects.prefetch_related("members")

    def team_members(self, team):
        """The agent ids of a team, sorted."""
        team = find_team("team", team)
        return list(team.members.order_by("agent_id").values_list("agent_id", flat=True))

    def set_team_members(self, team, *, add=(), remove=()):
        """Add and remove agents of a team (an agent already in it, or not in it, is no error); returns
        its members. A removed agent stops seeing the team's facts at its next read."""
        team = find_team("team", team)
        add, remove = _agent_ids("add", add), _agent_ids("remove", remove)
        with transaction.atomic():
            TeamMember.objects.bulk_create([TeamMember(team=team, agent_id=a) for a in add], ignore_conflicts=True)
            TeamMember.objects.filter(team=team, agent_id__in=remove).delete()
        return self.team_members(team)

    def delete_team(self, team, *, actor=""):
        """Delete a team, its memberships and its facts (each fact's history keeps a `deleted` version;
        an audit record lists them, `actor` deleting). Returns how many facts went with it."""
        try:
            team = find_team("team", team)
        except InvalidMemoryArgument:
            raise MemoryNotFound("team", team) from None
        return self.delete_teams([team.pk], actor=actor).cascaded["facts"]

    def delete_teams(self, ids, *, max_ids=None, actor=""):
        """Delete these teams (by id) as delete_team does, in one transaction; BatchDelete(deleted,
        not_found, cascaded={"facts": n})."""
        ids = check_id_list(ids, max_ids)
        with transaction.atomic():
            found = sorted(Team.objects.filter(pk__in=ids).values_list("pk", flat=True))
            facts = list(Fact.objects.filter(team__in=found).values_list("pk", flat=True))
            history.record_deleted(facts)
            Fact.objects.filter(pk__in=facts).delete()
            Team.objects.filter(pk__in=found).delete()
            if facts:
                write_deletion_record(actor, DeletionKind.FACTS, facts)
        return BatchDelete(len(found), [i for i in ids if i not in found], {"facts": len(facts)})
