"""One person's writes and their forgetting, serialised: the per-person lock both take.

A write for a person (a thread tracked after a turn, buffered recall events written) and forgetting
that person must not interleave: a write that lands after the forget commits leaves words with no
owner (a checkpoint no `Thread` row lists, recall events under a deleted id). Both take the person's
lock inside their transaction: on PostgreSQL a lock on the person's `MemoryUser` row (the forget takes
FOR UPDATE, writers FOR NO KEY UPDATE, which it conflicts with), on SQLite the database's write lock,
which every transaction takes at BEGIN (IMMEDIATE). A writer that gets the lock after a forget finds no
row and writes nothing for that person.

The forget's side is here (lock_for_forget); the writers' side is the storage backend's
`hold_people` (memory/backends/base.py), one statement the writes of every turn run several times.
"""

from django.db import connection

from ..models import MemoryUser
from .validation import chunks


def _require_transaction():
    if not connection.in_atomic_block:
        raise RuntimeError("the person lock is taken inside a transaction and held until it ends")


def lock_for_forget(user_ids):
    """The forget's side: wait for every write holding these people, and keep new ones out until it commits."""
    _require_transaction()
    for chunk in chunks(sorted({int(u) for u in user_ids})):
        list(MemoryUser.objects.select_for_update().filter(pk__in=chunk).order_by("pk").values_list("pk", flat=True))
