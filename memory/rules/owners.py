"""A user's owner key inside a query, following merges (the key itself: memory/models/owners.py)."""

from django.db.models import CharField, Subquery, Value
from django.db.models.functions import Cast, Coalesce, Concat

from ..models import MemoryUser, Scope
from ..models.owners import owner_prefix


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
