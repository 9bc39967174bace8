"""Owners: who a memory belongs to (Scope), and its owner key, the one indexable text that says so.

This is the one definition of the owner key: "session:<id>", "user:<id>", "agent:<id>" or "global",
and for an episode of a user with an agent "user:<id>/agent:<id>". A fact's `scope_key` (a column the
database generates, models.Fact), the backends' SQL and the Python code all take it from here; the
recall triggers of migration 0006 keep the frozen SQL copy of the same rule, which tests check
against this one.
"""

from django.db import models
from django.db.models import Case, Value, When
from django.db.models.functions import Cast, Concat


class Scope(models.TextChoices):
    """Who a fact belongs to, from most to least specific."""

    SESSION = "session", "Session"
    USER = "user", "User"
    AGENT = "agent", "Agent"
    GLOBAL = "global", "Global"


# Lower is more specific; a lookup returns the visible fact with the lowest rank.
SCOPE_RANK = {Scope.SESSION: 0, Scope.USER: 1, Scope.AGENT: 2, Scope.GLOBAL: 3}

GLOBAL = "global"
# An owner key is its scope and the owner's id, joined by ":"; an episode's two owners by "/".
_SEPARATOR, _JOIN = ":", "/"


def owner_prefix(scope):
    """The owner keys of `scope` start with this ("user:" ...)."""
    return f"{scope}{_SEPARATOR}"


def owner_key(scope, *, user_id=None, agent_id="", session_id=""):
    """The owner key of a fact of `scope` with these owner columns."""
    if scope == Scope.SESSION:
        return f"{owner_prefix(Scope.SESSION)}{session_id}"
    if scope == Scope.USER:
        return f"{owner_prefix(Scope.USER)}{user_id}"
    if scope == Scope.AGENT:
        return f"{owner_prefix(Scope.AGENT)}{agent_id}"
    return GLOBAL


def fact_owner_key(fact):
    """The owner key of a Fact (or anything with its owner attributes), without reading it back."""
    return owner_key(fact.scope, user_id=fact.user_id, agent_id=fact.agent_id, session_id=fact.session_id)


def agent_suffix(agent_id):
    """What follows a user's key in the key of that user's episodes with an agent ("/agent:<id>")."""
    return f"{_JOIN}{owner_key(Scope.AGENT, agent_id=agent_id)}"


def owner_key_expression():
    """The owner key of a row with scope, session_id, user_id and agent_id columns, as the database
    computes it (the expression of Fact.scope_key)."""
    return Case(
        When(scope=Scope.SESSION, then=Concat(Value(owner_prefix(Scope.SESSION)), "session_id")),
        When(scope=Scope.USER, then=Concat(Value(owner_prefix(Scope.USER)), Cast("user_id", models.CharField()))),
        When(scope=Scope.AGENT, then=Concat(Value(owner_prefix(Scope.AGENT)), "agent_id")),
        default=Value(GLOBAL),
    )


def user_owner_sql(user_id_sql):
    """SQL of the owner key of the user whose id `user_id_sql` computes."""
    return f"'{owner_prefix(Scope.USER)}' || CAST({user_id_sql} AS TEXT)"
