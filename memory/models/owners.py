"""Owners: who a memory belongs to (Scope), and its owner key, the one indexable text that says so.

This is the one definition of the owner key: "session:<id>", "user:<id>", "agent:<id>", "team:<id>" or "global",
and for an episode of a user with an agent "user:<id>/agent:<id>". A fact's `scope_key` (a column the
database generates, models.Fact), the backends' SQL and the Python code all take it from here; the
recall triggers of migration 0006 keep the frozen SQL copy of the same rule, which tests check
against this one.
"""

from functools import lru_cache

from django.db import models
from django.db.models import Case, Value, When
from django.db.models.functions import Cast, Concat

from .workspaces import UniqueInWorkspace, WorkspaceManager, workspace_field


class Scope(models.TextChoices):
    """Who a fact belongs to, from most to least specific."""

    SESSION = "session", "Session"
    USER = "user", "User"
    AGENT = "agent", "Agent"
    # Shared by the agents of a named group (Team): each member sees it, between its own and everyone's.
    TEAM = "team", "Team"
    GLOBAL = "global", "Global"


# Lower is more specific; a lookup returns the visible fact with the lowest rank.
SCOPE_RANK = {Scope.SESSION: 0, Scope.USER: 1, Scope.AGENT: 2, Scope.TEAM: 3, Scope.GLOBAL: 4}

GLOBAL = "global"
# An owner key is its scope and the owner's id, joined by ":"; an episode's two owners by "/".
_SEPARATOR, _JOIN = ":", "/"


def owner_prefix(scope):
    """The owner keys of `scope` start with this ("user:" ...)."""
    return f"{scope}{_SEPARATOR}"


def owner_key(scope, *, user_id=None, agent_id="", session_id="", team_id=None):
    """The owner key of a fact of `scope` with these owner columns."""
    if scope == Scope.SESSION:
        return f"{owner_prefix(Scope.SESSION)}{session_id}"
    if scope == Scope.USER:
        return f"{owner_prefix(Scope.USER)}{user_id}"
    if scope == Scope.AGENT:
        return f"{owner_prefix(Scope.AGENT)}{agent_id}"
    if scope == Scope.TEAM:
        return f"{owner_prefix(Scope.TEAM)}{team_id}"
    return GLOBAL


def fact_owner_key(fact):
    """The owner key of a Fact (or anything with its owner attributes), without reading it back."""
    return owner_key(
        fact.scope,
        user_id=fact.user_id,
        agent_id=fact.agent_id,
        session_id=fact.session_id,
        team_id=getattr(fact, "team_id", None),
    )


def agent_suffix(agent_id):
    """What follows a user's key in the key of that user's episodes with an agent ("/agent:<id>")."""
    return f"{_JOIN}{owner_key(Scope.AGENT, agent_id=agent_id)}"


def owner_key_expression():
    """The owner key of a row with scope, session_id, user_id, agent_id and team_id columns, as the database
    computes it (the expression of Fact.scope_key)."""
    return Case(
        When(scope=Scope.SESSION, then=Concat(Value(owner_prefix(Scope.SESSION)), "session_id")),
        When(scope=Scope.USER, then=Concat(Value(owner_prefix(Scope.USER)), Cast("user_id", models.CharField()))),
        When(scope=Scope.AGENT, then=Concat(Value(owner_prefix(Scope.AGENT)), "agent_id")),
        When(scope=Scope.TEAM, then=Concat(Value(owner_prefix(Scope.TEAM)), Cast("team_id", models.CharField()))),
        default=Value(GLOBAL),
    )


def user_owner_sql(user_id_sql):
    """SQL of the owner key of the user whose id `user_id_sql` computes."""
    return f"'{owner_prefix(Scope.USER)}' || CAST({user_id_sql} AS TEXT)"


def team_owners_sql(agent_id_sql):
    """SQL of the owner keys (column `owner`) of the teams of the agent whose id `agent_id_sql`
    computes: a subquery on the membership table, so a lookup finds an agent's team facts in its
    one statement. An owner term of many keys (owner_match)."""
    return (
        f"SELECT '{owner_prefix(Scope.TEAM)}' || CAST(m.team_id AS TEXT) AS owner "
        f"FROM {TeamMember._meta.db_table} m WHERE m.agent_id = {agent_id_sql}"
    )


def is_owner_set(sql):
    """Whether an owner term's SQL is a subquery of many owner keys (team_owners_sql), not one key."""
    return sql.startswith("SELECT ")


def owner_match(column, sql):
    """SQL condition: `column` holds the owner key of the term `sql` (one of its keys, for a set),
    in the form that drives an index on `column`."""
    return f"{column} IN ({sql})" if is_owner_set(sql) else f"{column} = {sql}"


def owners_condition(column, terms, *, probe=True):
    """(SQL condition, params): `column` holds the owner key of one of `terms` ((sql, params, rank)).

    Single keys only: one IN list. With a set (an agent's teams) and `probe` (the condition finds the
    rows through an index on `column`): one IN over a subquery of every key, the set's rows included,
    so the (owner, key) index is probed once per key; OR'ing a second IN made SQLite collect row ids
    from two index scans and read the rows after. Without `probe` (rows found otherwise, each one
    checked): the IN list, or else an EXISTS per set, a probe of the membership index, without
    building the set's keys into a temporary table first.
    """
    sql, order = _owners_condition(column, tuple(sql for sql, _, _ in terms), probe)
    return sql, [p for i in order for p in terms[i][1]]


@lru_cache(maxsize=256)
def _owners_condition(column, sqls, probe):
    """owners_condition's SQL for terms of these SQL texts, and the order of the terms' parameters in
    it: built once per shape of viewer, as every lookup asks for it (the same string each time also
    keeps the statements built from it cheap to look up)."""
    single = [i for i, sql in enumerate(sqls) if not is_owner_set(sql)]
    sets = [i for i, sql in enumerate(sqls) if is_owner_set(sql)]
    listed = f"{column} IN ({', '.join(sqls[i] for i in single)})"
    if not sets:
        return listed, (*single,)
    if not probe:
        exists = [f"EXISTS (SELECT 1 FROM ({sqls[i]}) t WHERE t.owner = {column})" for i in sets]
        return "(" + " OR ".join([listed, *exists]) + ")", (*single, *sets)
    keys = " UNION ALL ".join([*(f"SELECT {sqls[i]}" for i in single), *(sqls[i] for i in sets)])
    return f"{column} IN ({keys})", (*single, *sets)


class Team(UniqueInWorkspace, models.Model):
    """A named group of agents that share facts: a fact of scope "team" is seen by every member,
    more specific than a global fact and less than the agent's own (SCOPE_RANK)."""

    # A team belongs to one workspace, as its agents' facts do; its name is unique in its workspace.
    workspace = workspace_field("teams")
    name = models.CharField(max_length=128)
    description = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = WorkspaceManager()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["name", "workspace"], name="one_team_per_name"),
            models.CheckConstraint(condition=~models.Q(name=""), name="team_name_not_blank"),
        ]

    def __str__(self):
        return self.name


class TeamMember(models.Model):
    """One agent in one team (agent ids are plain strings in Engram, as on facts and episodes)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="members")
    agent_id = models.CharField(max_length=128)
    created_at = models.DateTimeField(auto_now_add=True)

    # Of the workspace of its team (memory.models.workspaces).
    workspace_through = "team"
    objects = WorkspaceManager()

    class Meta:
        db_table = "memory_team_member"
        ordering = ["team", "agent_id"]
        constraints = [
            models.UniqueConstraint(fields=["agent_id", "team"], name="one_membership_per_agent_and_team"),
            models.CheckConstraint(condition=~models.Q(agent_id=""), name="team_member_agent_not_blank"),
        ]

    def __str__(self):
        return f"{self.agent_id} in {self.team_id}"
