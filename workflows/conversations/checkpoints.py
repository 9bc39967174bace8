"""Conversation checkpoints as operators see them: listed and deleted per thread, through the saver's public API.

Checkpoints are not Django rows: they live in the shared LangGraph saver and are only reached
through `BaseCheckpointSaver` methods (`list`, `get_tuple`, `delete_thread`), never its tables.
The tracked `Thread` rows say which threads exist. A checkpoint cannot be deleted on its own (the
saver has no public method for it, and a thread with a hole in its parent chain could not be
resumed), so the unit of deletion is the thread: deleting a thread removes all its checkpoints and
their pending writes (see workflows.conversations.threads.delete_threads).

A checkpoint's blob size is the length of the checkpoint as the saver's own serializer encodes it
(`saver.serde.dumps_typed`): channel values, versions and all, without its metadata and pending writes.
"""

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from memory.models import DeletionKind
from memory.service import BatchDelete, MemoryService, check_id_list

from ..models import Thread
from .checkpointer import get_checkpointer
from .threads import checkpoint_size, delete_threads

# LangGraph checkpoint ids are UUIDs (version 6) in their text form.
CHECKPOINT_ID_PATTERN = r"^[0-9a-fA-F-]{1,64}$"
# The longest thread id a Thread row holds (Thread.thread_id).
MAX_THREAD_ID_LENGTH = Thread._meta.get_field("thread_id").max_length


@dataclass(frozen=True)
class CheckpointRow:
    """One checkpoint of a thread, with what an operator needs to judge it."""

    thread_id: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    step: int | None
    source: str
    blob_size: int
    created_at: datetime | None
    message_count: int
    pending_writes: int


def _config(thread_id, checkpoint_id=None):
    configurable = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def _row(saver, thread_id, item):
    metadata = item.metadata or {}
    checkpoint = item.checkpoint
    messages = (checkpoint.get("channel_values") or {}).get("messages") or []
    ts = checkpoint.get("ts")
    return CheckpointRow(
        thread_id=thread_id,
        checkpoint_id=item.config["configurable"]["checkpoint_id"],
        parent_checkpoint_id=(item.parent_config or {}).get("configurable", {}).get("checkpoint_id"),
        step=metadata.get("step"),
        source=metadata.get("source", ""),
        blob_size=checkpoint_size(saver, checkpoint),
        created_at=datetime.fromisoformat(ts) if ts else None,
        message_count=len(messages) if isinstance(messages, list) else 0,
        pending_writes=len(item.pending_writes or []),
    )


def is_valid_thread_id(value):
    """A thread id a Thread row could hold: a non-empty string without NUL, at most MAX_THREAD_ID_LENGTH long."""
    return isinstance(value, str) and 0 < len(value) <= MAX_THREAD_ID_LENGTH and "\x00" not in value


def thread_checkpoints(thread_id, *, limit=None, before=None):
    """A thread's checkpoints, newest first: at most `limit`, only those older than checkpoint id `before`."""
    saver = get_checkpointer()
    before_config = _config(thread_id, before) if before else None
    return [_row(saver, thread_id, item) for item in saver.list(_config(thread_id), before=before_config, limit=limit)]


def head_checkpoint(thread_id):
    """The thread's newest checkpoint (one `get_tuple`), or None when the saver holds none."""
    saver = get_checkpointer()
    item = saver.get_tuple(_config(thread_id))
    return _row(saver, thread_id, item) if item is not None else None


def tracked_threads():
    """Every tracked thread (newest activity first), with its workflow and user in the same query."""
    return Thread.objects.select_related("workflow", "user")


def delete_checkpoints(thread_ids, *, max_ids=None, actor=""):
    """Delete threads' checkpoints (and writes) by thread id, all or nothing; returns memory.service.BatchDelete.

    A thread counts as deleted when a Thread row tracks it or the saver still holds checkpoints for
    it (left over by an untracked run); the rest are `not_found`. Rows go in this transaction, the
    saver's checkpoints once it commits. Malformed ids raise InvalidMemoryArgument naming `ids[i]`.
    """
    thread_ids = check_id_list(
        thread_ids,
        max_ids,
        noun="thread id",
        valid=is_valid_thread_id,
        expected=f"a thread id (a non-empty string of at most {MAX_THREAD_ID_LENGTH} characters)",
    )
    with transaction.atomic():
        tracked = set(Thread.objects.filter(thread_id__in=thread_ids).values_list("thread_id", flat=True))
        # An orphan is tracked by no workspace (the base manager sees every one); another
        # workspace's thread is not found here.
        anywhere = set(Thread._base_manager.filter(thread_id__in=thread_ids).values_list("thread_id", flat=True))
        saver = get_checkpointer()
        orphans = {t for t in thread_ids if t not in anywhere and saver.get_tuple(_config(t)) is not None}
        found = tracked | orphans
        if found:
            delete_threads(sorted(found))
            MemoryService().record_deletion(actor, DeletionKind.THREADS, sorted(found))
    return BatchDelete(len(found), [t for t in thread_ids if t not in found])
