"""One person's writes and their forgetting, serialised: the per-person lock both take.

A write for a person (a thread tracked after a turn, buffered recall events written) and forgetting
that person must not interleave: a write that lands after the forget commits leaves words with no
owner (a checkpoint no `Thread` row lists, recall events under a deleted id). Both take the person's
lock inside their transaction: on PostgreSQL a lock on the person's `MemoryUser` row (the forget takes
FOR UPDATE, writers FOR NO KEY UPDATE, which it conflicts with), on SQLite the database's write lock,
which every transaction takes at BEGIN (IMMEDIATE). A writer that gets the lock after a forget finds no
row and writes nothing for that person.
"""

from django.db import connection

from ..models import MemoryUser
from .validation import chunks


def _require_transaction():
    if not connection.in_atomic_block:
        raise RuntimeError("the person lock is taken inside a transaction and held until it ends")


def hold_people(user_ids):
    """Lock these people against a concurrent forget until the transaction ends; returns the ids that
    still exist (a forgotten person's are missing: write nothing for them)."""
    _require_transaction()
    alive = set()
    for chunk in chunks(sorted({int(u) for u in user_ids})):
        rows = MemoryUser.objects.select_for_update(no_key=True).filter(pk__in=chunk).order_by("pk")
        alive.update(rows.values_list("pk", flat=True))
    return alive


def lock_for_forget(user_ids):
    """The forget's side: wait for every write holding these people, and keep new ones out until it commits."""
    _require_transaction()
    for chunk in chunks(sorted({int(u) for u in user_ids})):
        list(MemoryUser.objects.select_for_update().filter(pk__in=chunk).order_by("pk").values_list("pk", flat=True))
