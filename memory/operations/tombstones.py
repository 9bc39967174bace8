"""Tombstones of forgotten people: their ids and keyed hashes of their channel ids, no names, no text.

Forgetting a person (MemoryService.delete_users with cascade) keeps one Tombstone row per memory user id
and per channel identity, so `memory import` of an export taken before the forget refuses to bring them
back, naming the lines, unless told to (`--allow-forgotten`, `import_memories(allow_forgotten=True)`).
A channel id is kept only as an HMAC keyed with the site's SECRET_KEY (Django's `salted_hmac`): a
Telegram id is a small number, and a plain hash of it would be reversed by trying them all. Checks try
SECRET_KEY_FALLBACKS too, so a rotated key still recognises them while the old key is listed there.
"""

from django.conf import settings
from django.utils.crypto import salted_hmac

from ..models import ChannelIdentity, MemoryUser, Tombstone
from ..rules.validation import chunks

_SALT = "engram.memory.tombstone"


def _digest(kind, value, secret=None):
    return salted_hmac(_SALT, f"{kind}\x00{value}", secret=secret, algorithm="sha256").hexdigest()


def _digests(kind, value):
    secrets = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    return {_digest(kind, value, secret) for secret in secrets}


def _identity(channel, external_id):
    return f"{channel}:{external_id}"


def bury(user_ids):
    """Inside the forget's transaction, before the rows go: a tombstone per user id and identity."""
    rows = []
    for chunk in chunks(sorted(user_ids)):
        for pk, canonical in MemoryUser.objects.filter(pk__in=chunk).values_list("pk", "canonical_id"):
            rows.append(Tombstone(forgotten_id=pk, digest=_digest("user", pk)))
            rows.append(Tombstone(forgotten_id=pk, digest=_digest("identity", canonical)))
        for user_id, channel, external in ChannelIdentity.objects.filter(user_id__in=chunk).values_list(
            "user_id", "channel", "external_id"
        ):
            rows.append(Tombstone(forgotten_id=user_id, digest=_digest("identity", _identity(channel, external))))
    Tombstone.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def forgotten_rows(user_rows, identity_rows):
    """[(line, field, message)] for rows of an import that belong to a forgotten person.

    `user_rows`: {user id: (line, canonical id)}; `identity_rows`: {(channel, external id): line}. Only
    rows the database does not hold are given (a stored row is left as it is anyway).
    """
    errors = []
    wanted = {}  # digest -> [(line, field)]: a user's canonical id and its identity hash alike
    for pk, (line, canonical) in user_rows.items():
        for d in _digests("user", pk):
            wanted.setdefault(d, []).append((line, "id"))
        for d in _digests("identity", canonical):
            wanted.setdefault(d, []).append((line, "canonical_id"))
    for (channel, external), line in identity_rows.items():
        for d in _digests("identity", _identity(channel, external)):
            wanted.setdefault(d, []).append((line, "external_id"))
    hits = {}
    for chunk in chunks(sorted(wanted)):
        for digest, when in Tombstone.objects.filter(digest__in=chunk).values_list("digest", "forgotten_at"):
            for line, field in wanted[digest]:
                hits.setdefault((line, field), when)
    for (line, field), when in sorted(hits.items()):
        errors.append(
            (
                line,
                field,
                f"belongs to a person who was forgotten on {when:%Y-%m-%d}; an import does not bring them back "
                "unless told to (memory import --allow-forgotten)",
            )
        )
    return errors


def is_forgotten(user_id):
    """Whether memory user `user_id` was forgotten: a tombstone holds the id and no user has it (again). One query.

    Asked by writers outside the memory's transactions (a checkpoint store's), where a user row made in
    a transaction not yet committed is not visible but a committed forget's tombstone is.
    """
    from django.db.models import Exists, OuterRef

    alive = MemoryUser.objects.filter(pk=OuterRef("forgotten_id"))
    return Tombstone.objects.filter(forgotten_id=user_id).filter(~Exists(alive)).exists()


def forgotten_sql(placeholder="%s", schema=""):
    """is_forgotten as one SQL statement for a connection of another library on the same database (a
    checkpoint store's), where opening a Django connection per check would cost more than the write:
    a row when the user id (given twice) was forgotten. `schema` prefixes the table names (a schema
    or an attached database's name, with its dot)."""
    tombstones, users = f"{schema}{Tombstone._meta.db_table}", f"{schema}{MemoryUser._meta.db_table}"
    return (
        f"SELECT 1 FROM {tombstones} WHERE forgotten_id = {placeholder} "
        f"AND NOT EXISTS (SELECT 1 FROM {users} WHERE id = {placeholder}) LIMIT 1"
    )
