"""Once per period across machines: the guard of the beat's periodic jobs (memory/tasks.py).

Two beats (a second machine started with one, a deploy that overlaps) each send every job of the
schedule; the first run of a job in a period inserts its PeriodicRun row and runs, every other finds
the row (a unique constraint) and skips. A run that dies is not repeated within its period: the
jobs are sweeps, and the next period's run takes up what was left.
"""

import os
import socket
from datetime import UTC, datetime, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from ..exceptions import InvalidMemoryArgument
from ..models import PeriodicRun

# Rows of periods older than this are deleted by each run (a record, not a ledger).
KEEP = timedelta(days=7)


def period_start(seconds, now=None):
    """The start of the period of `seconds` that `now` falls in (periods counted from the epoch, UTC)."""
    now = now or timezone.now()
    stamp = now.timestamp()
    return datetime.fromtimestamp(stamp - stamp % seconds, tz=UTC)


def once_per_period(name, seconds, *, now=None):
    """True for the first caller of `name` in the current period of `seconds`; False for every other."""
    if not isinstance(seconds, (int, float)) or seconds <= 0:
        raise InvalidMemoryArgument("seconds", f"must be a positive number of seconds, got {seconds!r}")
    start = period_start(float(seconds), now)
    try:
        with transaction.atomic():
            PeriodicRun.objects.create(
                name=name, period_start=start, started_by=f"{socket.gethostname()}:{os.getpid()}"
            )
    except IntegrityError:
        return False
    PeriodicRun.objects.filter(name=name, period_start__lt=start - KEEP).delete()
    return True
