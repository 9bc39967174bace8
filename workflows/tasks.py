"""The workflows app's background work as a Celery task (with memory's, memory/tasks.py).

`workflows.deliver_reminders` is one `memory reminders --once`: reminders that are due and the
outbox's Telegram replies, each claimed with a lease in the database (workflows/channels/delivery.py),
so the semantics stay those of the loop: a reminder is sent by one worker, and again only when that
worker died after sending and before recording it (at most one duplicate per killed worker: Telegram's
sendMessage takes no idempotency key). The beat sends it every TASK_PERIODS["deliver_reminders"]
seconds; each period runs once across machines, and a run drains everything due.
"""

from celery import shared_task

from memory.service import MemoryService

from .channels.delivery import run_worker


@shared_task(name="workflows.deliver_reminders", ignore_result=True)
def deliver_reminders(period):
    if not MemoryService().once_per_period("deliver_reminders", period):
        return None
    report = run_worker(once=True)
    return {"delivered": report.delivered, "replies_sent": report.replies_sent}
