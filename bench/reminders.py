"""Reminder delivery benchmark: many reminders due at once, worker processes, one killed midway.

    python -m bench.reminders [--reminders 10000] [--users 500] [--workers 2] [--lease 15] [--batch 20]
                              [--kill-at 0.5] [--database-url postgres://...] [--json]

Makes a scratch database with REMINDERS reminders of USERS Telegram users, all due, then starts
WORKERS real `manage.py memory reminders` processes against a fake Telegram Bot API in this process,
and kills the first with SIGKILL once KILL_AT of the reminders have reached the Bot API. Its claims
come back after the lease (--lease; the default 120 s would outlast the benchmark). Counts what the
Bot API received: each reminder's text is unique, so a text received twice is a duplicate. Seconds
run from starting the workers to the last reminder received (the workers' start-up included).
"""

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .support.scratch import REPO, add_scratch_arguments, machine_reference, scratch_django

TOKEN = "bench:token"
TIMEOUT = 300  # seconds to wait for every reminder before giving up


def seed(reminders, users):
    from datetime import timedelta

    from django.db import connections
    from django.utils import timezone

    from memory.service import MemoryService
    from workflows.models import Reminder

    service = MemoryService()
    people = [service.get_or_create_user("telegram", str(100_000 + n))[0].pk for n in range(users)]
    at = timezone.now() - timedelta(seconds=1)
    Reminder.objects.bulk_create(
        [
            Reminder(
                user_id=people[n % users], agent_id="bench", message=f"reminder {n}", due_at=at, next_attempt_at=at
            )
            for n in range(reminders)
        ],
        batch_size=1000,
    )
    connections.close_all()  # the workers write now; this process only reads at the end


def start_worker(args, log):
    command = [sys.executable, "manage.py", "memory", "reminders", "--lease", str(args.lease)]
    command += ["--batch", str(args.batch), "--poll", "0.2"]
    return subprocess.Popen(command, cwd=REPO, env=dict(os.environ), stdout=log, stderr=log)


def run(args, bot, progress):
    log_path = os.path.join(os.environ["ENGRAM_DATA_DIR"], "workers.log")
    task = progress.add_task(f"{args.reminders:,} reminders, {args.workers} workers", total=args.reminders)
    killed_after = None
    with open(log_path, "w") as log:
        started = time.perf_counter()
        workers = [start_worker(args, log) for _ in range(args.workers)]
        try:
            while True:
                sent = bot.sent_count()
                progress.update(task, completed=min(sent, args.reminders))
                if killed_after is None and sent >= args.kill_at * args.reminders:
                    workers[0].send_signal(signal.SIGKILL)
                    killed_after = sent
                    progress.update(
                        task, description=f"{args.reminders:,} reminders, worker 1 killed at {killed_after:,}"
                    )
                if sent >= args.reminders and len({m["text"] for m in bot.sent_messages()}) >= args.reminders:
                    break
                if time.perf_counter() - started > TIMEOUT:
                    break
                if all(w.poll() is not None for w in workers):
                    break
                time.sleep(0.1)
            seconds = time.perf_counter() - started
            time.sleep(0.5)  # anything still in flight would show up as a duplicate
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.send_signal(signal.SIGTERM)
            for worker in workers:
                try:
                    worker.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()
    counts = collections.Counter(m["text"] for m in bot.sent_messages())
    from workflows.models import Reminder, ReminderStatus

    rows = Reminder.objects.filter(status=ReminderStatus.DELIVERED).count()
    return {
        "due": args.reminders,
        "delivered": len(counts),
        "duplicates": sum(n - 1 for n in counts.values()),
        "duplicated": sorted(text for text, n in counts.items() if n > 1)[:5],
        "seconds": round(seconds, 2),
        "killed_after": killed_after,
        "rows_delivered": rows,
        "exit_codes": [w.returncode for w in workers],
        "log": open(log_path).read()[-1500:] if len(counts) < args.reminders else "",
    }


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.reminders", description=__doc__.splitlines()[0])
    parser.add_argument("--reminders", type=int, default=10_000, help="reminders due at once (default 10000)")
    parser.add_argument("--users", type=int, default=500, help="Telegram users they belong to (default 500)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--lease", type=float, default=15, help="the workers' lease in seconds (default 15)")
    parser.add_argument("--batch", type=int, default=20, help="reminders per claim (default 20)")
    parser.add_argument(
        "--kill-at", type=float, default=0.5, help="share delivered when worker 1 is killed (default 0.5)"
    )
    add_scratch_arguments(parser, seed=False)
    args = parser.parse_args(argv)
    if min(args.reminders, args.users, args.workers, args.batch) < 1 or not 0 < args.kill_at < 1:
        parser.error("--reminders, --users, --workers and --batch must be positive, --kill-at between 0 and 1")
    from workflows.channels.fake_telegram import FakeBotAPI

    err = Console(stderr=True)
    with FakeBotAPI() as bot:
        # Read by the site's settings, here and in the worker processes.
        os.environ.update(TELEGRAM_API_BASE=bot.url, TELEGRAM_BOT_TOKEN=TOKEN)
        with scratch_django(args.database_url, mode="keyword"):
            from django.db import connection

            database = connection.vendor
            with err.status(f"seeding {args.reminders:,} reminders of {args.users:,} users"):
                seed(args.reminders, args.users)
            columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
            with Progress(*columns, console=err, transient=True) as progress:
                results = run(args, bot, progress)
    if args.json:
        print(json.dumps({k: results[k] for k in ("due", "delivered", "duplicates", "seconds")}))
        return 0 if results["delivered"] == results["due"] and not results["duplicates"] else 1
    table = Table(title=f"Reminder delivery ({database}; {args.workers} worker processes, one killed with SIGKILL)")
    for column in ("due", "delivered", "duplicates", "seconds", "killed after", "rows delivered"):
        table.add_column(column, justify="right")
    table.add_row(
        f"{results['due']:,}",
        f"{results['delivered']:,}",
        str(results["duplicates"]),
        f"{results['seconds']:.1f}",
        f"{results['killed_after']:,}" if results["killed_after"] is not None else "–",
        f"{results['rows_delivered']:,}",
    )
    console = Console()
    console.print(table)
    if results["duplicated"]:
        console.print(f"received more than once: {', '.join(results['duplicated'])}")
    console.print(
        f"lease {args.lease:g} s, {args.batch} per claim, {args.users:,} users; worker exit codes {results['exit_codes']}"
    )
    if results["log"]:
        console.print(results["log"])
    console.print(machine_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
