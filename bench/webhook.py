"""Webhook benchmark: Telegram updates over HTTP to the demo workflow on a real threaded WSGI server.

    python -m bench.webhook [--updates 500] [--users 50] [--concurrency 4] [--workers 2] [--mode keyword|hybrid]
                            [--server wsgi|asgi] [--database-url postgres://...] [--json]
    python -m bench.webhook --crash [--outage 10] [...]   (a server process killed mid-load, the Bot API
                            down for a while: see bench/support/crash.py)

Starts the site under gunicorn (WORKERS processes of 4 threads each), or with --server asgi under
uvicorn (WORKERS processes; Django runs the sync views in its thread pool), on a free port of 127.0.0.1,
over a scratch database with the demo workflow (identify_user -> recall -> agent with the offline
responder and conversation memory -> remember), and a fake Telegram Bot API on another port that
takes the replies (in this process, like the HTTP client: Telegram's side). Then sends N updates from U users, C at a time, each user alternately telling
("my favourite number is K") and asking ("what is my favourite number?"), and times each request
from send to response (the run and its sendMessage included). An update that does not come back
200 with a run and a sent reply is an error.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from .support.scratch import add_mode_argument, add_scratch_arguments, machine_reference, scratch_django
from .support.servers import (
    SECRET,
    THREADS_PER_WORKER,
    TOKEN,
    WARMUP,
    cpu_between,
    cpu_seconds,
    free_port,
    server_log,
    start_server,
    text_for,
    wait_until_serving,
)


def run(updates, users, concurrency, workers, progress, kind="wsgi"):
    import httpx
    from django.db import connections

    from workflows.channels.fake_telegram import telegram_update
    from workflows.demo import ensure_demo_workflow

    workflow, _ = ensure_demo_workflow()
    connections.close_all()
    port = free_port()
    server = start_server(port, workers, kind)
    url = f"http://127.0.0.1:{port}/telegram/{workflow.slug}/webhook/"
    headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
    local = threading.local()

    def client():
        # A new connection per update, as the kernel then hands each to whichever worker accepts
        # first; kept-alive connections would each stay with one worker, however busy.
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=30, limits=httpx.Limits(max_keepalive_connections=0))
        return local.client

    def send(update):
        started = time.perf_counter()
        try:
            response = client().post(url, json=update, headers=headers)
            body = response.json() if response.status_code == 200 else {}
        except (httpx.HTTPError, ValueError) as exc:
            return time.perf_counter() - started, f"{type(exc).__name__}: {exc}"
        elapsed = time.perf_counter() - started
        if body.get("status") != "ran" or not body.get("reply_sent"):
            return elapsed, f"HTTP {response.status_code}: {response.text[:200]}"
        return elapsed, None

    try:
        wait_until_serving(server, port)
        # Every worker compiles the graph, opens its connections, creates the checkpoint tables.
        warmup = [telegram_update(10_000_000 + i, 999_000 + i, "hello") for i in range(WARMUP * workers)]
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            list(pool.map(send, warmup))
        plan = [telegram_update(n + 1, 1000 + n % users, text_for(n, n % users)) for n in range(updates)]
        task = progress.add_task(f"{updates} updates, {concurrency} at a time", total=updates)
        latencies, errors = [], []
        cpu_before = cpu_seconds(server.pid)
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            for elapsed, error in pool.map(send, plan):
                latencies.append(elapsed)
                if error:
                    errors.append(error)
                progress.advance(task)
        wall = time.perf_counter() - started
        cpu, model_cpu = cpu_between(cpu_before, cpu_seconds(server.pid))
        # Whether the vectors kept up: documents still waiting for the embedding worker when the last
        # reply came (a backlog that grows with the run means vector recall misses recent messages).
        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30).json()
        pending = (health.get("vectors") or {}).get("pending")
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log = server_log(server, tail=None)
        server.log.close()
    # A reply can succeed while a turn went without memory (the workflow logs the failure and answers
    # anyway): such turns are not errors of the webhook, but a run that had them did not do its work.
    errors_logged = [line for line in log.splitlines() if " ERROR " in line]
    latencies.sort()
    return {
        "updates": updates,
        "per_s": updates / wall,
        "p50_ms": statistics.median(latencies) * 1000,
        "p95_ms": latencies[max(0, int(round(0.95 * len(latencies))) - 1)] * 1000,
        "max_ms": latencies[-1] * 1000,
        "errors": len(errors),
        "first_errors": errors[:3],
        "wall_s": wall,
        # The server's CPU per update, all its processes, and the share of its model processes (the
        # documents' embeddings): unlike the rate, this hardly moves with what else the machine runs.
        "cpu_ms": cpu * 1000 / updates,
        "model_cpu_ms": model_cpu * 1000 / updates,
        "vectors_pending": pending,
        "server_log_chars": len(log),  # what the server wrote to stderr (a log that grows per update costs)
        "errors_logged": len(errors_logged),
        "first_errors_logged": errors_logged[:3],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.webhook", description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=500, help="updates to send (default 500)")
    parser.add_argument("--users", type=int, default=50, help="Telegram users sending them (default 50)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight at once (default 4)")
    parser.add_argument("--workers", type=int, default=2, help="server processes, 4 threads each (default 2)")
    parser.add_argument("--server", choices=["wsgi", "asgi"], default="wsgi", help="gunicorn (wsgi) or uvicorn (asgi)")
    parser.add_argument(
        "--crash",
        action="store_true",
        help="SIGKILL a server process mid-load and take the Bot API down; count lost updates and duplicate replies",
    )
    parser.add_argument("--outage", type=float, default=10.0, help="--crash: seconds the Bot API is down (default 10)")
    add_scratch_arguments(parser, seed=False)
    add_mode_argument(parser)
    args = parser.parse_args(argv)
    if min(args.updates, args.users, args.concurrency, args.workers) < 1:
        parser.error("--updates, --users, --concurrency and --workers must be positive")
    if args.crash and (args.server != "wsgi" or args.outage < 0):
        parser.error("--crash runs under gunicorn (--server wsgi), with --outage >= 0")
    from workflows.channels.fake_telegram import FakeBotAPI

    if args.crash:
        return crash_main(args)

    err = Console(stderr=True)
    with FakeBotAPI() as bot:
        # Read by the site's settings when Django starts inside scratch_django.
        os.environ.update(TELEGRAM_API_BASE=bot.url, TELEGRAM_BOT_TOKEN=TOKEN, TELEGRAM_WEBHOOK_SECRET=SECRET)
        os.environ.pop("ENGRAM_CHAT_MODEL", None)  # the offline responder: no network, no model time
        with scratch_django(args.database_url, mode=args.mode), Progress(console=err, transient=True) as progress:
            from django.db import connection

            database = connection.vendor
            results = run(args.updates, args.users, args.concurrency, args.workers, progress, args.server)
        sent = len(bot.sent_messages()) - WARMUP * args.workers
    if sent != args.updates - results["errors"]:
        results["errors"] = max(results["errors"], args.updates - sent)
    results["mode"], results["server"] = args.mode, args.server
    if args.json:
        keys = [
            "updates",
            "mode",
            "server",
            "per_s",
            "p50_ms",
            "p95_ms",
            "cpu_ms",
            "model_cpu_ms",
            "errors",
            "vectors_pending",
            "server_log_chars",
            "errors_logged",
        ]
        print(json.dumps({k: round(results[k], 3) if isinstance(results[k], float) else results[k] for k in keys}))
        return 0
    table = Table(
        title=f"Telegram webhook -> demo workflow ({database}, {args.mode}; "
        + (
            f"uvicorn, {args.workers} workers"
            if args.server == "asgi"
            else f"gunicorn, {args.workers} workers x {THREADS_PER_WORKER} threads"
        )
        + ")"
    )
    table.add_column("updates", justify="right")
    table.add_column("per second", justify="right")
    table.add_column("p50 ms", justify="right")
    table.add_column("p95 ms", justify="right")
    table.add_column("max ms", justify="right")
    table.add_column("server CPU ms / update", justify="right")
    table.add_column("of it, model processes", justify="right")
    table.add_column("errors", justify="right")
    table.add_column("vectors pending", justify="right")
    table.add_row(
        f"{results['updates']:,}",
        f"{results['per_s']:.1f}",
        f"{results['p50_ms']:.1f}",
        f"{results['p95_ms']:.1f}",
        f"{results['max_ms']:.1f}",
        f"{results['cpu_ms']:.1f}",
        f"{results['model_cpu_ms']:.1f}",
        str(results["errors"]),
        str(results["vectors_pending"]),
    )
    console = Console()
    console.print(table)
    console.print(
        f"{args.users} users, {args.concurrency} requests in flight, {WARMUP * args.workers} warm-up updates not counted; "
        f"{sent:,} replies reached the fake Bot API."
    )
    for error in results["first_errors"]:
        console.print(f"[red]error:[/] {error}")
    console.print(
        f"The server wrote {results['server_log_chars']:,} characters to its log, "
        f"{results['errors_logged']} lines of them errors."
    )
    for line in results["first_errors_logged"]:
        console.print(f"[red]logged:[/] {line}")
    console.print(machine_reference())
    return 0


def crash_main(args):
    from workflows.channels.fake_telegram import FakeBotAPI

    from .support.crash import run_crash

    err = Console(stderr=True)
    with FakeBotAPI() as bot:
        os.environ.update(TELEGRAM_API_BASE=bot.url, TELEGRAM_BOT_TOKEN=TOKEN, TELEGRAM_WEBHOOK_SECRET=SECRET)
        os.environ.pop("ENGRAM_CHAT_MODEL", None)
        with scratch_django(args.database_url, mode=args.mode), Progress(console=err, transient=True) as progress:
            from django.db import connection

            database = connection.vendor
            results = run_crash(
                bot,
                updates=args.updates,
                users=args.users,
                concurrency=args.concurrency,
                workers=args.workers,
                outage=args.outage,
                progress=progress,
            )
    results.update(database=database, mode=args.mode)
    if args.json:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in results.items()}))
        return 0
    table = Table(
        title=f"Telegram webhook, crash: one of {args.workers} gunicorn workers killed, Bot API down "
        f"{args.outage:g} s ({database}, {args.mode})"
    )
    names = ["updates", "runs_completed", "runs_restarted", "replies_sent", "duplicate_replies", "lost_updates"]
    for name in names:
        table.add_column(name.replace("_", " "), justify="right")
    table.add_row(*(f"{results[name]:,}" for name in names))
    console = Console()
    console.print(table)
    console.print(
        f"Killed at {results['killed_at_s']} s, Bot API down at {results['bot_api_down_at_s']} s; "
        f"{results['http_tries']:,} webhook requests for {results['updates']:,} updates "
        f"({results['requests_cut']} cut off without an answer, {results['gave_up']} given up); all answered after {results['answered_s']:.1f} s, replies drained "
        f"after {results['wall_s']:.1f} s; {results['replies_failed']} replies failed for good."
    )
    if results["first_lost"]:
        console.print(f"[red]lost:[/] updates {results['first_lost']}")
    console.print(machine_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
