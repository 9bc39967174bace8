"""Claims on Telegram updates: each update_id runs once, and a run that did not finish is run again.

A delivery of an update claims it before the run: a new `TelegramUpdate` row in state `running`, held
by this server process (`claimed_by`) until `claimed_until`. While the process is alive, one thread of
it renews the leases of the runs it holds, every third of TELEGRAM_RUN_LEASE_SECONDS, so a long run
keeps its claim. A process that dies mid-run (SIGKILL, out of memory, a lost host) stops renewing:
once its lease has run out, the next delivery of the update (Telegram retries every update it got no
200 for) takes the claim over and runs it. While the lease holds, another delivery is told to come back
later (the webhook answers 503), never "duplicate": the run might still die. A finished run's record
(`done`) makes every later delivery a duplicate.

Leases are compared with each process's own clock: keep hosts' clocks in sync (NTP). A process that
stalls longer than the lease (suspended, swapping) can lose its claim to another and the update then
runs twice; the late one finds its claim gone when it records the finish, and sends no reply.
"""

import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.db import DatabaseError, IntegrityError, close_old_connections, transaction
from django.db.models import F, Q
from django.utils import timezone

from ..conf import workflow_settings
from ..models import TelegramUpdate, UpdateStatus

logger = logging.getLogger("engram.workflows")

_token_lock = threading.Lock()
_token = (None, "")  # (pid, token): a forked server process gets a token of its own


def process_token():
    """Who holds claims: host, process id and a random part (a restarted process with the same pid is someone else)."""
    global _token
    pid = os.getpid()
    if _token[0] != pid:
        with _token_lock:
            if _token[0] != pid:
                _token = (pid, f"{socket.gethostname()[:40]}:{pid}:{uuid.uuid4().hex[:8]}")
    return _token[1]


def lease():
    return timedelta(seconds=float(workflow_settings.TELEGRAM_RUN_LEASE_SECONDS))


@dataclass
class Claim:
    """The outcome of claiming an update: `new` or `taken_over` (run it), `done` (a duplicate), `busy`."""

    state: str
    row: TelegramUpdate
    token: str = ""

    @property
    def runs(self):
        return self.state in ("new", "taken_over")


def claim_update(workflow, update_id):
    """Claim `update_id` of `workflow` for this process; see the module's docstring."""
    token = process_token()
    for _ in range(2):  # a second time if the row went between the insert and the read (a run released it)
        now = timezone.now()
        try:
            with transaction.atomic():
                row = TelegramUpdate.objects.create(
                    workflow=workflow, update_id=update_id, claimed_by=token, claimed_until=now + lease()
                )
        except IntegrityError:
            row = TelegramUpdate.objects.filter(workflow=workflow, update_id=update_id).first()
            if row is None:
                continue
        else:
            heartbeat.hold(row.pk)
            return Claim("new", row, token)
        if row.status == UpdateStatus.DONE:
            return Claim("done", row)
        if row.claimed_until is not None and row.claimed_until > now:
            return Claim("busy", row)
        # The holder stopped renewing: it died mid-run. One UPDATE that repeats the condition, so
        # of two deliveries that both saw the stale claim only one takes it.
        stale = Q(claimed_until__isnull=True) | Q(claimed_until__lte=now)
        taken = TelegramUpdate.objects.filter(stale, pk=row.pk, status=UpdateStatus.RUNNING).update(
            claimed_by=token, claimed_until=now + lease(), attempts=F("attempts") + 1
        )
        if not taken:
            now_row = TelegramUpdate.objects.filter(pk=row.pk).first() or row
            return Claim("done" if now_row.status == UpdateStatus.DONE else "busy", now_row)
        logger.warning(
            "telegram update %s of workflow %s: its run by %s did not finish (lease ran out): running it again",
            update_id,
            workflow.slug,
            row.claimed_by or "a process",
        )
        heartbeat.hold(row.pk)
        row.refresh_from_db()
        return Claim("taken_over", row, token)
    return Claim("busy", TelegramUpdate(workflow=workflow, update_id=update_id))


def finish(claim, **changes):
    """Record the claimed run as finished (inside the caller's transaction); False if the claim was lost."""
    heartbeat.drop(claim.row.pk)
    return (
        TelegramUpdate.objects.filter(pk=claim.row.pk, claimed_by=claim.token, status=UpdateStatus.RUNNING).update(
            status=UpdateStatus.DONE, claimed_by="", claimed_until=None, finished_at=timezone.now(), **changes
        )
        == 1
    )


def release(claim):
    """Give an update back after its run raised, so that its next delivery runs it from the start."""
    heartbeat.drop(claim.row.pk)
    TelegramUpdate.objects.filter(pk=claim.row.pk, claimed_by=claim.token, status=UpdateStatus.RUNNING).delete()


class Heartbeat:
    """One thread per process that renews the leases of the runs this process holds."""

    def __init__(self):
        self._lock = threading.Lock()
        self._held = set()
        self._pid = None
        self._wake = threading.Event()

    def hold(self, pk):
        with self._lock:
            self._held.add(pk)
            if self._pid != os.getpid():  # none yet in this process (or it was forked from one that had it)
                self._pid = os.getpid()
                threading.Thread(target=self._run, name="telegram-claims-heartbeat", daemon=True).start()

    def drop(self, pk):
        with self._lock:
            self._held.discard(pk)

    def held(self):
        with self._lock:
            return set(self._held)

    def renew(self):
        """Push the lease of every run this process holds to now + the lease; returns how many rows."""
        ids = self.held()
        if not ids:
            return 0
        return TelegramUpdate.objects.filter(
            pk__in=ids, claimed_by=process_token(), status=UpdateStatus.RUNNING
        ).update(claimed_until=timezone.now() + lease())

    def _run(self):
        while True:
            self._wake.wait(lease().total_seconds() / 3)
            close_old_connections()  # a long-lived thread: drop connections past their age or broken
            try:
                self.renew()
            except DatabaseError as exc:  # the next beat tries again; a lease is 3 beats long
                logger.error("telegram claims: renewing the leases of running updates failed: %s", exc)


heartbeat = Heartbeat()
