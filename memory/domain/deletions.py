"""What every deletion shares: its answer (BatchDelete), its audit record, and which requested ids exist."""

from dataclasses import dataclass, field

from ..models import DeletionRecord
from ..rules.validation import chunks


@dataclass(frozen=True)
class BatchDelete:
    """What a batch delete did: how many rows went, which requested ids did not exist."""

    deleted: int
    not_found: list[int]
    cascaded: dict[str, int] = field(default_factory=dict)
    # Forgetting people: what the scrub after the commit did (memory.operations.erasure.ErasureOutcome), else None.
    erasure: object = None


# What makes a user "in use" for a delete without cascade: memories, not statistics or threads.
MEMORY_HELD = ("facts", "episodes", "identities", "merged_users", "store_items")


def write_deletion_record(actor, kind, ids, cascaded=None):
    """The audit record of one deletion (in its transaction): ids and counts, never a name."""
    DeletionRecord.objects.create(
        actor=(str(actor).strip() or "code")[:200], kind=kind, count=len(ids), ids=list(ids), cascaded=cascaded or {}
    )


def existing_ids(model, ids):
    found = set()
    for chunk in chunks(ids):
        # The default manager: inside a workspace, another workspace's ids are not found.
        found.update(model._default_manager.filter(pk__in=chunk).values_list("pk", flat=True))
    return found
