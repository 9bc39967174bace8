"""Workflow runs kept as records: started and finished around a run, what each node's event shows of
memory, and the runs' part in memory's lifecycle (forgetting, merging, exporting, pruning a person).

A run's events are stored as its event stream sent them (workflows.graph.runtime.RunStream), so a reload or
another operator sees the same run. They hold the person's words: forgetting the person deletes
their runs (by memory user, and by the identity they came from when nobody was identified), and
`memory verify-erasure` finds any left, as it scans every table.
"""

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Count, Q
from django.dispatch import receiver
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from memory.admin.site import memories_site
from memory.exceptions import PersonForgotten
from memory.rules.validation import storable
from memory.service import BatchDelete, MemoryService
from memory.signals import person_exporting, prune_requested, users_deleting, users_footprint, users_merged

from ..conf import workflow_settings
from ..models import Workflow, WorkflowRun

logger = logging.getLogger("engram.workflows")


class EventType:
    """The events of a run's stream, in the order they come."""

    RUN_STARTED = "run_started"
    NODE_STARTED = "node_started"
    NODE_FINISHED = "node_finished"
    NODE_ERROR = "node_error"
    RUN_FINISHED = "run_finished"


@dataclass(frozen=True)
class Event:
    type: str
    data: dict

    def as_dict(self):
        return {"event": self.type, "data": self.data}


def _json_default(value):
    """How a state value that is not JSON goes into an event: messages by their type and content."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    message_type = getattr(value, "type", None)
    if isinstance(message_type, str) and hasattr(value, "content"):
        out = {"type": message_type, "content": value.content}
        for name in ("name", "tool_calls", "tool_call_id"):
            if getattr(value, name, None):
                out[name] = getattr(value, name)
        return out
    return repr(value)


def jsonable(value):
    """`value` as plain JSON data any database column keeps (NULs and lone surrogates replaced)."""
    text = json.dumps(value, default=_json_default)
    data = json.loads(text)
    # json.dumps writes every NUL as \u0000 and every surrogate (those of a pair too) as \udxxx: a
    # text with neither holds no string storable would change, and most events are such texts.
    if "\\u0000" in text or "\\ud" in text:
        return storable(data)
    return data


def admin_url(kind, pk):
    """The /memories/ page of a fact or an episode (None if the admin is not installed in this project)."""
    if pk is None:
        return None
    try:
        return reverse(f"{memories_site.name}:memory_{kind}_change", args=[pk])
    except NoReverseMatch:
        return None


def node_memory(output):
    """What a node's event shows of memory, from the node's own update (nothing is queried again):
    recall's hits and winning scopes; remember's writes, each linked to its row in /memories/."""
    if not isinstance(output, dict):
        return {}
    memory = {}
    trace = output.get("recall_trace")
    if isinstance(trace, dict):
        memory.update(hits=trace.get("hits", []), scopes=trace.get("scopes", {}), cut=trace.get("cut", []))
    writes = output.get("memory_writes")
    if isinstance(writes, list):
        memory["writes"] = [{**w, "admin_url": admin_url(w.get("kind"), w.get("id"))} for w in writes]
    return memory


def start_run(workflow, info, trigger):
    """The record of a run about to start (committed at once: a reload sees it running)."""
    return WorkflowRun.objects.create(
        workflow=workflow,
        workflow_version=workflow.version,
        trigger=info.type,
        input=jsonable(trigger.get("payload") or {}),
        channel=info.channel[:50],
        external_id=info.external_id[:255],
        started_at=timezone.now(),
    )


def finish_run(run, *, state, events, errors, status, duration_ms, then=None):
    """Write what the run did onto its record, in one statement, under the person's lock
    (memory/rules/persons.py). The memory user is the one identify_user found; if they were forgotten
    meanwhile, on any server, the record goes instead: it holds their words and their channel id.

    `then(person_kept)`: what the caller records of the finish (a channel's update and reply), in the
    same transaction, the person still held (`person_kept`: False if they were forgotten); its answer
    is returned. If it raises, the record is written without it, and the error goes on.
    """
    state = state or {}
    user_id = (state.get("user") or {}).get("id")
    try:
        with transaction.atomic():
            kept = True
            if user_id is not None:
                try:
                    MemoryService().hold_person(user_id)
                except PersonForgotten:
                    WorkflowRun.objects.filter(pk=run.pk).delete()
                    logger.warning("run %s not kept: memory user %s was forgotten while it ran", run.pk, user_id)
                    kept = False
            if kept:
                _write_finished(run, state, user_id, events, errors, status, duration_ms)
            return then(kept) if then is not None else None
    except Exception:
        if then is None:
            raise
        finish_run(run, state=state, events=events, errors=errors, status=status, duration_ms=duration_ms)
        raise


def _write_finished(run, state, user_id, events, errors, status, duration_ms):
    WorkflowRun.objects.filter(pk=run.pk).update(
        user_id=user_id,
        thread_id=(state.get("thread_id") or "")[:300],
        reply=storable(state.get("reply") or ""),
        events=[e.as_dict() for e in events],
        errors=jsonable(errors),
        status=status,
        finished_at=timezone.now(),
        duration_ms=round(duration_ms, 3),
    )


def delete_runs(ids):
    """Delete runs by id; reports the ids that did not exist."""
    ids = list(dict.fromkeys(int(i) for i in ids))
    found = set(WorkflowRun.objects.filter(pk__in=ids).values_list("pk", flat=True))
    deleted, _ = WorkflowRun.objects.filter(pk__in=ids).delete()
    return BatchDelete(deleted, [i for i in ids if i not in found])


def runs_of(user_ids):
    """The runs of these memory users: theirs, and those from one of their identities that identified
    nobody (identify_user failed: the words are still theirs)."""
    user_ids = list(user_ids)
    senders = Q(pk__in=[])
    for _, channel, external_id in MemoryService().channel_identities(user_ids):
        senders |= Q(channel=channel, external_id=external_id)
    return WorkflowRun.objects.filter(Q(user_id__in=user_ids) | (Q(user__isnull=True) & senders))


# ------------------------------------------------------------------ memory's lifecycle


@receiver(users_deleting, dispatch_uid="workflows_runs_of_deleted_users")
def _users_deleting(sender, user_ids, **kwargs):
    runs_of(user_ids).delete()


@receiver(users_merged, dispatch_uid="workflows_runs_follow_merge")
def _users_merged(sender, source_id, target_id, **kwargs):
    WorkflowRun.objects.filter(user_id=source_id).update(user_id=target_id)


@receiver(users_footprint, dispatch_uid="workflows_runs_footprint")
def _users_footprint(sender, user_ids, **kwargs):
    return {"workflow runs": runs_of(user_ids).aggregate(n=Count("id"))["n"]}


@receiver(person_exporting, dispatch_uid="workflows_runs_export")
def _person_exporting(sender, user_ids, **kwargs):
    fields = ("trigger", "input", "channel", "thread_id", "reply", "errors", "status", "started_at", "finished_at")
    return [
        {"kind": "workflow_run", "workflow": slug, **row}
        for slug, row in (
            (r.pop("workflow__slug"), r) for r in runs_of(user_ids).order_by("pk").values("workflow__slug", *fields)
        )
    ]


@receiver(prune_requested, dispatch_uid="workflows_runs_prune")
def _prune_requested(sender, agent_id=None, dry_run=False, **kwargs):
    """Runs started more than RUN_RETENTION_DAYS ago (an agent id is a workflow's slug)."""
    days = workflow_settings.RUN_RETENTION_DAYS
    if days is None:
        return {}
    old = WorkflowRun.objects.filter(started_at__lt=timezone.now() - timedelta(days=days))
    if agent_id is not None:
        old = old.filter(workflow__in=Workflow.objects.filter(slug=agent_id))
    return {"workflow runs": old.count() if dry_run else old.delete()[0]}
