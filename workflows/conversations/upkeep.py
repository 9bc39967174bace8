"""What workflows add to memory's upkeep: checkpoint limits, the checkpointer's health, consolidation after runs.

- `memory prune` (memory.signals.prune_requested) also keeps every workflow within
  MAX_THREADS_PER_WORKFLOW and every thread within MAX_CHECKPOINTS_PER_THREAD.
- `/healthz` reports whether the checkpointer answers.
- `after_run` is called when a run ends: it records the use and outcome of the procedures its
  prompt carried, trims the run's thread and, with MEMORY CONSOLIDATION["AFTER_EACH_RUN"],
  consolidates the run's episode. It never raises into the run; problems join `memory_errors`.

A thread is trimmed in one transaction of the saver's store (workflows.conversations.checkpointer.keep_newest_checkpoints):
the older checkpoints and their writes go, the newest stay untouched, so the conversation resumes
where it was and a crash leaves either the old thread or the trimmed one, never an empty one. Only
the root namespace is trimmed (the graphs here have no subgraph checkpoints), and channels must store
whole values (DeltaChannel, a LangGraph beta, is not used here).
"""

import logging
from datetime import datetime

from django.utils import timezone

from memory.operations import health, metrics
from memory.service import MemoryService
from memory.signals import prune_requested

from ..conf import workflow_settings
from ..models import Reminder, ReminderStatus, Thread, Workflow
from .checkpointer import get_checkpointer, keep_newest_checkpoints
from .threads import checkpoint_size, prune_threads

logger = logging.getLogger("engram.workflows")


def _config(thread_id, checkpoint_id=None):
    configurable = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def trim_thread(thread_id, keep=None):
    """Keep the `keep` newest checkpoints of a thread (default MAX_CHECKPOINTS_PER_THREAD); returns how many went."""
    keep = workflow_settings.MAX_CHECKPOINTS_PER_THREAD if keep is None else keep
    if not keep:
        return 0
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    saver = get_checkpointer()
    total = sum(1 for _ in saver.list(_config(thread_id)))
    if total <= keep:
        return 0
    newest = list(saver.list(_config(thread_id), limit=keep))
    kept = [item.config["configurable"]["checkpoint_id"] for item in newest]
    keep_newest_checkpoints(thread_id, kept)  # one transaction: the thread is never without them
    size = sum(checkpoint_size(saver, item.checkpoint) for item in newest)
    Thread.objects.filter(thread_id=thread_id).update(checkpoint_count=keep, checkpoint_bytes=size)
    return total - keep


def prune_all_threads(*, dry_run=False):
    """Apply the thread limits that are set, everywhere: {"threads": n, "checkpoints": n} for those
    limits (what would go, on a dry run); {} when neither is set."""
    deleted = {}
    keep_threads = workflow_settings.MAX_THREADS_PER_WORKFLOW
    if keep_threads:
        deleted["threads"] = 0
        for workflow_id in Workflow.objects.values_list("pk", flat=True):
            if dry_run:
                deleted["threads"] += max(0, Thread.objects.filter(workflow_id=workflow_id).count() - keep_threads)
            else:
                deleted["threads"] += prune_threads(workflow_id)
    keep = workflow_settings.MAX_CHECKPOINTS_PER_THREAD
    if keep:
        deleted["checkpoints"] = 0
        # checkpoint_count may lag behind the saver; trim_thread counts for itself.
        over = Thread.objects.filter(checkpoint_count__gt=keep).values_list("thread_id", "checkpoint_count")
        for thread_id, count in over:
            deleted["checkpoints"] += count - keep if dry_run else trim_thread(thread_id, keep)
    return deleted


def _prune_requested(sender, agent_id=None, dry_run=False, **kwargs):
    # Threads belong to workflows, not agents: a prune of one agent leaves them alone.
    if agent_id is not None:
        return {}
    return prune_all_threads(dry_run=dry_run)


def checkpointer_status():
    """ "ok" when the saver answers a read, else "unreachable" (logged)."""
    try:
        get_checkpointer().get_tuple(_config("engram-healthz"))
    except Exception:  # any failure of a third-party saver means it cannot serve conversations
        logger.exception("checkpointer health check failed")
        return "unreachable"
    return "ok"


def record_procedure_outcomes(state):
    """Count a use of each procedure the run's prompt carried, with the run's outcome and duration.

    A run succeeded when it replied and no memory operation failed (the rule the remember node
    records on the episode). Returns the procedures recorded.
    """
    procedures = (state.get("memories") or {}).get("procedures") or []
    if not procedures:
        return 0
    success = bool(state.get("reply")) and not state.get("memory_errors")
    duration_ms = None
    started = state.get("run_started_at")
    if started:
        duration_ms = max(0.0, (timezone.now() - datetime.fromisoformat(started)).total_seconds() * 1000)
    service = MemoryService()
    for procedure in procedures:
        service.record_procedure_use(procedure["id"], success=success, duration_ms=duration_ms)
    return len(procedures)


def after_run(state):
    """Upkeep when a run ends: record the procedures it used, trim its thread, consolidate its
    episode (if set to). Never raises.

    Returns the problems as `memory_errors` entries (node "after_run", operation, error); empty when all went well.
    """
    problems = []

    def attempt(operation, func, *args):
        try:
            func(*args)
        except Exception as exc:  # the run's answer stands; the next run or prune catches up
            logger.exception("after a run: %s failed", operation)
            problems.append({"node": "after_run", "operation": operation, "error": str(exc)})

    attempt("record_procedure_use", record_procedure_outcomes, state)
    thread_id = state.get("thread_id")
    keep = workflow_settings.MAX_CHECKPOINTS_PER_THREAD
    if thread_id and keep and Thread.objects.filter(thread_id=thread_id, checkpoint_count__gt=keep).exists():
        attempt("trim_thread", trim_thread, thread_id)
    episode_id = state.get("episode_id")
    if episode_id:
        report = MemoryService().consolidate_after_run(episode_id)  # never raises; a no-op unless AFTER_EACH_RUN
        if report is not None and not report.ok:
            errors = [*report.errors, *(f"episode {pk}: {err}" for pk, err in report.failed.items())]
            problems.extend({"node": "after_run", "operation": "consolidate", "error": e} for e in errors)
    return problems


def connect():
    """Join memory's lifecycle (called from WorkflowsConfig.ready)."""
    prune_requested.connect(_prune_requested, dispatch_uid="workflows_prune_threads")
    health.register_component("checkpointer", checkpointer_status)
    metrics.register_gauge("reminders_due", "Reminders due and not sent yet (pending, their time come).", reminders_due)


def reminders_due():
    """Pending reminders a worker may take now (the reminder_due index): a growing figure means no
    worker is sending them."""
    return Reminder.objects.filter(status=ReminderStatus.PENDING, next_attempt_at__lte=timezone.now()).count()
