"""Conversation threads: the public API to list, inspect and delete them (rows and checkpoints alike).

A thread is one memory user's conversation with one workflow: thread id
`<memory user id>:<conversation id>:<workflow id>`, the conversation being "direct" for one-to-one
chats or the group's id. The checkpoints live in the shared saver and are only ever reached through
its public methods (`list`, `delete_thread`); the `Thread` rows track them so they can be listed.

Deleting a Thread row in any way (here, through its user or its workflow, in the admin) deletes its
checkpoints once the transaction commits. When two users are merged, the merged user's threads move
to the surviving user, so a person continues their conversation after the merge; where both had a
thread for the same conversation and workflow, the more recently active one is kept.
"""

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import Count, F, Sum
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils import timezone

from memory.exceptions import LimitReached, PersonForgotten
from memory.operations.erasure import register_participant, scrub_after_commit
from memory.service import MemoryService
from memory.signals import (
    person_exporting,
    users_deleting,
    users_footprint,
    users_merged,
)

from ..conf import workflow_settings
from ..models import Thread
from .checkpointer import get_checkpointer, person_thread_ids

logger = logging.getLogger("engram.workflows")


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint of a thread, as `saver.list` describes it."""

    checkpoint_id: str
    parent_checkpoint_id: str | None
    created_at: datetime | None
    step: int | None
    source: str
    message_count: int


def checkpoint_size(saver, checkpoint):
    """A checkpoint's size: its length as the saver's own serializer encodes it (channel values and all)."""
    return len(saver.serde.dumps_typed(checkpoint)[1])


def thread_id_for(user_id, conversation_id, workflow_id=None, *, graph=""):
    """`<user>:<conversation>:<workflow id>`, or `<user>:<conversation>:graph:<name>` for a graph built in code."""
    return f"{user_id}:{conversation_id}:graph:{graph}" if graph else f"{user_id}:{conversation_id}:{workflow_id}"


def _config(thread_id):
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


@dataclass(frozen=True)
class ThreadRef:
    """The thread a run continues: its id, and the newest checkpoint already counted ("" if new)."""

    thread_id: str
    head_checkpoint_id: str = ""
    tracked: bool = False


def _runs_in(workflow_id, graph):
    """The Thread filter of a workflow's threads, or of a code-built graph's."""
    return {"workflow_id": workflow_id} if not graph else {"workflow__isnull": True, "graph": graph}


def thread_for(*, user_id, conversation_id, workflow_id=None, graph=""):
    """The thread a user's conversation with a workflow (or a graph built in code) continues (one query)."""
    row = (
        Thread.objects.filter(user_id=user_id, conversation_id=conversation_id, **_runs_in(workflow_id, graph))
        .values_list("thread_id", "head_checkpoint_id")
        .first()
    )
    if row is None:
        return ThreadRef(thread_id_for(user_id, conversation_id, workflow_id, graph=graph))
    return ThreadRef(row[0], row[1], tracked=True)


def thread_ref(thread_id):
    """The thread `thread_id` as a run continues it: tracked with its newest counted checkpoint, or new (one query)."""
    head = Thread.objects.filter(thread_id=thread_id).values_list("head_checkpoint_id", flat=True).first()
    return ThreadRef(thread_id) if head is None else ThreadRef(thread_id, head, tracked=True)


def record_activity(ref, *, user_id, conversation_id, channel, workflow_id=None, graph=""):
    """Track a run on a thread: last activity, channel, and the checkpoints it added.

    Under the person's lock (MemoryService.hold_person): if they were forgotten while the turn ran,
    the checkpoints it wrote are deleted and PersonForgotten is raised (and logged); nothing is kept.
    """
    now = timezone.now()
    added, size, head = _count_new_checkpoints(ref.thread_id, ref.head_checkpoint_id)
    try:
        with transaction.atomic():
            MemoryService().hold_person(user_id)
            if ref.tracked and _count_activity(ref.thread_id, now, added, size, channel, head):
                return
            created = _create_thread(ref, workflow_id, graph, user_id, conversation_id, channel, now, added, size, head)
    except PersonForgotten:
        # The forget deleted what it could see; this turn's checkpoints came after it, so they go here.
        get_checkpointer().delete_thread(ref.thread_id)
        # The forget's own scrub (statistics, WAL files) came before these checkpoints went: again.
        scrub_after_commit([user_id])
        logger.warning(
            "thread %s not kept: memory user %s was forgotten while the turn ran; its checkpoints were deleted",
            ref.thread_id,
            user_id,
        )
        raise
    if created:
        prune_threads(workflow_id, graph=graph)


def _count_activity(thread_id, now, added, size, channel, head):
    """Count a run on an existing thread's row; False if there is no such row."""
    changes = {
        "last_activity": now,
        "checkpoint_count": F("checkpoint_count") + added,
        "checkpoint_bytes": F("checkpoint_bytes") + size,
    }
    if channel:
        changes["channel"] = channel
    if head:
        changes["head_checkpoint_id"] = head
    return Thread.objects.filter(thread_id=thread_id).update(**changes) > 0


def _create_thread(ref, workflow_id, graph, user_id, conversation_id, channel, now, added, size, head):
    try:
        with transaction.atomic():
            Thread.objects.create(
                thread_id=ref.thread_id,
                workflow_id=None if graph else workflow_id,
                graph=graph,
                user_id=user_id,
                conversation_id=conversation_id,
                channel=channel,
                last_activity=now,
                checkpoint_count=added,
                checkpoint_bytes=size,
                head_checkpoint_id=head,
            )
    except IntegrityError:
        # Another request tracked it first: count ours on its row.
        _count_activity(ref.thread_id, now, added, size, channel, head)
        return False
    return True


def _count_new_checkpoints(thread_id, head):
    """(checkpoints, their bytes, the newest's id) added to a thread since the checkpoint `head`."""
    saver = get_checkpointer()
    added, size, newest = 0, 0, ""
    for item in saver.list(_config(thread_id)):
        checkpoint_id = item.config["configurable"]["checkpoint_id"]
        if checkpoint_id == head:
            break
        newest = newest or checkpoint_id
        added += 1
        size += checkpoint_size(saver, item.checkpoint)
    return added, size, newest


def checkpoint_bytes_of(user_id):
    """The bytes of checkpoints a person's tracked threads hold (one query)."""
    return Thread.objects.filter(user_id=user_id).aggregate(n=Sum("checkpoint_bytes"))["n"] or 0


def check_checkpoint_room(user_id):
    """Raise LimitReached when a person's threads hold WORKFLOWS["MAX_CHECKPOINT_BYTES_PER_USER"] or more.

    Checked before a turn, so a turn that starts under the cap is kept whole: the cap is passed by
    at most one turn's checkpoints per conversation. No cap (None), no query.
    """
    limit = workflow_settings.MAX_CHECKPOINT_BYTES_PER_USER
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError("WORKFLOWS['MAX_CHECKPOINT_BYTES_PER_USER'] must be a non-negative integer or None")
    held = checkpoint_bytes_of(user_id)
    if held >= limit:
        raise LimitReached(
            "conversation",
            f"this person's conversations hold {held} bytes of checkpoints, the limit is {limit} "
            "(WORKFLOWS['MAX_CHECKPOINT_BYTES_PER_USER']): this turn is not kept. Delete or trim their "
            "threads (MAX_CHECKPOINTS_PER_THREAD), or raise the limit",
            limit="MAX_CHECKPOINT_BYTES_PER_USER",
            value=limit,
        )


def list_threads(*, workflow_id=None, user_ids=None):
    """Tracked threads (with workflow and user), most recently active first: a QuerySet, to filter or page."""
    qs = Thread.objects.select_related("workflow", "user")
    if workflow_id is not None:
        qs = qs.filter(workflow_id=workflow_id)
    if user_ids is not None:
        qs = qs.filter(user_id__in=list(user_ids))
    return qs


def list_checkpoints(thread_id, *, limit=None):
    """A thread's checkpoints, newest first, through the saver's public `list`."""
    items = []
    for item in get_checkpointer().list(_config(thread_id), limit=limit):
        metadata = item.metadata or {}
        messages = (item.checkpoint.get("channel_values") or {}).get("messages") or []
        ts = item.checkpoint.get("ts")
        items.append(
            CheckpointInfo(
                checkpoint_id=item.config["configurable"]["checkpoint_id"],
                parent_checkpoint_id=(item.parent_config or {}).get("configurable", {}).get("checkpoint_id"),
                created_at=datetime.fromisoformat(ts) if ts else None,
                step=metadata.get("step"),
                source=metadata.get("source", ""),
                message_count=len(messages) if isinstance(messages, list) else 0,
            )
        )
    return items


def delete_threads(thread_ids):
    """Delete threads by id: their rows now, their checkpoints when the transaction commits. Returns rows deleted."""
    thread_ids = list(dict.fromkeys(thread_ids))
    with transaction.atomic():
        tracked = set(Thread.objects.filter(thread_id__in=thread_ids).values_list("thread_id", flat=True))
        deleted, _ = Thread.objects.filter(thread_id__in=thread_ids).delete()
        for thread_id in set(thread_ids) - tracked:  # checkpoints of threads no row tracks
            _delete_checkpoints_on_commit(thread_id)
    return deleted


def delete_user_threads(user_ids):
    """Delete every thread of the given memory users (rows now, checkpoints on commit)."""
    with transaction.atomic():
        deleted, _ = Thread.objects.filter(user_id__in=list(user_ids)).delete()
    return deleted


def prune_threads(workflow_id=None, *, graph=""):
    """Keep the MAX_THREADS_PER_WORKFLOW most recently active threads of a workflow (or a graph built
    in code); delete the rest."""
    keep = workflow_settings.MAX_THREADS_PER_WORKFLOW
    if not keep:
        return 0
    stale = list(
        Thread.objects.filter(**_runs_in(workflow_id, graph))
        .order_by("-last_activity", "-id")
        .values_list("pk", flat=True)[keep:]
    )
    if not stale:
        return 0
    deleted, _ = Thread.objects.filter(pk__in=stale).delete()
    return deleted


def _delete_checkpoints_on_commit(thread_id):
    def delete():
        get_checkpointer().delete_thread(thread_id)

    transaction.on_commit(delete, robust=True)


@receiver(post_delete, sender=Thread, dispatch_uid="workflows_thread_checkpoints")
def _thread_deleted(sender, instance, **kwargs):
    _delete_checkpoints_on_commit(instance.thread_id)


@receiver(users_deleting, dispatch_uid="workflows_threads_of_deleted_users")
def _users_deleting(sender, user_ids, **kwargs):
    delete_user_threads(user_ids)
    user_ids = list(user_ids)

    def delete_untracked():
        # Threads no row tracks yet (a first turn in flight on another server when the forget took
        # the person's lock): their checkpoints were written before it, none can be written after
        # it (checkpointer.person_held), so once it commits this finds them all.
        for thread_id in person_thread_ids(user_ids):
            get_checkpointer().delete_thread(thread_id)

    transaction.on_commit(delete_untracked, robust=True)
    # The checkpoint file's WAL is truncated by the erasure's scrub after the commit (registered
    # below), after these threads' checkpoints are deleted (their on-commit deletes come first).


@receiver(users_footprint, dispatch_uid="workflows_threads_footprint")
def _users_footprint(sender, user_ids, **kwargs):
    counts = Thread.objects.filter(user_id__in=list(user_ids)).aggregate(
        n=Count("id"), checkpoints=Sum("checkpoint_count")
    )
    return {"threads": counts["n"] or 0, "checkpoints": counts["checkpoints"] or 0}


@receiver(person_exporting, dispatch_uid="workflows_threads_export")
def _person_exporting(sender, user_ids, **kwargs):
    """A person's threads, each with its messages and running summary as the newest checkpoint holds them."""
    rows = []
    for thread in Thread.objects.filter(user_id__in=list(user_ids)).order_by("pk"):
        latest = get_checkpointer().get_tuple(_config(thread.thread_id))
        values = (latest.checkpoint.get("channel_values") or {}) if latest else {}
        messages = values.get("messages", [])
        rows.append(
            {
                "kind": "thread",
                "thread_id": thread.thread_id,
                "conversation_id": thread.conversation_id,
                "channel": thread.channel,
                "created_at": thread.created_at,
                "last_activity": thread.last_activity,
                "messages": [{"type": getattr(m, "type", ""), "content": getattr(m, "content", "")} for m in messages],
                # The running summary of the turns that left the history (the agent's summarize_history).
                "summary": values.get("conversation_summary", ""),
            }
        )
    return rows


def scrub_checkpoint_files():
    """SQLite checkpoints: truncate the WAL, so deleted checkpoints' page images leave the disk.
    Returns the problems (a reader that kept the WAL past the wait), as erasure participants do."""
    from .checkpointer import scrub_sqlite_files

    problem = scrub_sqlite_files()
    return [problem] if problem else []


def _scan_checkpoints(needles, user_ids):
    """verify-erasure's look at the checkpoint store: thread ids of these users, and (SQLite) its file bytes."""
    from memory.operations.erasure import file_traces

    from .checkpointer import checkpoint_path, checkpointer_kind

    traces = []
    saver = get_checkpointer()
    prefixes = tuple(f"{u}:" for u in user_ids)
    kept = {c.config["configurable"]["thread_id"] for c in saver.list(None)} if user_ids else set()
    for thread_id in sorted(t for t in kept if t.startswith(prefixes)):
        traces.append(("checkpoints", f"thread {thread_id} of a forgotten user still has checkpoints"))
    if checkpointer_kind() == "sqlite":
        traces += file_traces(checkpoint_path(), needles)
    return traces


def _person_tables():
    """The workflows' tables (threads, reminders, ...) and, on PostgreSQL, the checkpointer's."""
    from django.apps import apps

    from .checkpointer import checkpointer_kind

    tables = [m._meta.db_table for m in apps.get_app_config("workflows").get_models()]
    if checkpointer_kind() == "postgres":
        tables += ["checkpoints", "checkpoint_blobs", "checkpoint_writes"]
    return tables


register_participant("workflows", tables=_person_tables, scrub=scrub_checkpoint_files, scan=_scan_checkpoints)


@receiver(users_merged, dispatch_uid="workflows_threads_follow_merge")
def _users_merged(sender, source_id, target_id, **kwargs):
    def conversation(t):
        return t.workflow_id, t.graph, t.conversation_id

    kept = {conversation(t): t for t in Thread.objects.select_for_update().filter(user_id=target_id)}
    for thread in Thread.objects.select_for_update().filter(user_id=source_id):
        other = kept.get(conversation(thread))
        if other is None:
            Thread.objects.filter(pk=thread.pk).update(user_id=target_id)
        elif thread.last_activity > other.last_activity:
            other.delete()
            Thread.objects.filter(pk=thread.pk).update(user_id=target_id)
        else:
            thread.delete()
