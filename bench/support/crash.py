"""`python -m bench.webhook --crash`: Telegram updates under load while a server process dies and the Bot API goes down.

Starts the site under gunicorn (WORKERS processes of 4 threads) and the delivery worker (`manage.py
memory reminders`, which also sends the outbox's replies) over a scratch database with the demo
workflow, and a fake Bot API in this process. Sends N updates, C at a time, each as Telegram does:
again, with a growing pause, until it gets a 200. A third of the way in it SIGKILLs one gunicorn
worker process (whatever it was running dies with it); halfway it takes the Bot API down for
`--outage` seconds (connections refused). Then it waits for the outbox to drain and counts, from the
database and the fake Bot API: runs completed, runs started again after the kill, replies sent,
duplicate replies, and lost updates (no finished run, or no reply). Each update is sent in a group
chat of its own, so that every reply names its update.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from .scratch import REPO

CHAT_BASE = 1_000_000_000  # update n is sent in group chat -(CHAT_BASE + n)


def chat_of(n):
    return -(CHAT_BASE + n)


def worker_pids(master):
    """The gunicorn master's worker processes (Linux: /proc)."""
    path = Path(f"/proc/{master.pid}/task/{master.pid}/children")
    return [int(pid) for pid in path.read_text().split()] if path.exists() else []


def start_delivery_worker():
    """The delivery worker (`manage.py memory reminders`) in a child process with this process's environment."""
    import tempfile

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO)])}
    log = tempfile.TemporaryFile("w+")
    command = [sys.executable, "manage.py", "memory", "reminders", "--poll", "0.5"]
    process = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log, text=True)
    process.log = log
    return process


def stop(process, timeout=15):
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_crash(bot, *, updates, users, concurrency, workers, outage, progress, give_up=300):
    import httpx
    from django.db import connections

    from workflows.channels.fake_telegram import telegram_update
    from workflows.demo import ensure_demo_workflow
    from workflows.models import ReplyStatus, TelegramReply, TelegramUpdate, UpdateStatus

    from .servers import SECRET, WARMUP, free_port, server_log, start_server, text_for, wait_until_serving

    workflow, _ = ensure_demo_workflow()
    connections.close_all()
    port = free_port()
    server = start_server(port, workers)
    delivery = start_delivery_worker()
    url = f"http://127.0.0.1:{port}/telegram/{workflow.slug}/webhook/"
    headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
    local = threading.local()
    deadline = time.monotonic() + give_up

    def client():
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=0))
        return local.client

    def deliver(update):
        """Post until a 200, pausing 0.5 s, 1 s, 2 s… (at most 8 s) between tries, as Telegram retries."""
        tries, pause = 0, 0.5
        while True:
            tries += 1
            try:
                response = client().post(url, json=update, headers=headers)
                if response.status_code == 200:
                    return tries, response.json().get("status", "")
            except (httpx.HTTPError, ValueError):
                cut.append(1)  # the server process died under the request, or refused it: Telegram tries again
            if time.monotonic() > deadline:
                return tries, "gave up"
            time.sleep(pause)
            pause = min(pause * 2, 8)

    events, cut = {}, []
    try:
        wait_until_serving(server, port)
        warmup = [telegram_update(10_000_000 + i, 999_000 + i, "hello") for i in range(WARMUP * workers)]
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            list(pool.map(deliver, warmup))
        plan = [
            telegram_update(n, 1000 + n % users, text_for(n, n % users), chat_id=chat_of(n), chat_type="group")
            for n in range(1, updates + 1)
        ]
        task = progress.add_task(f"{updates} updates, {concurrency} at a time, one crash", total=updates)
        tries, statuses = [], Counter()
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            futures = [pool.submit(deliver, update) for update in plan]
            for done, future in enumerate(as_completed(futures), start=1):
                count, status = future.result()
                tries.append(count)
                statuses[status] += 1
                progress.advance(task)
                if "killed" not in events and done >= updates // 3:
                    victim = worker_pids(server)[0]
                    os.kill(victim, signal.SIGKILL)
                    events["killed"] = (victim, round(time.perf_counter() - started, 1))
                if "outage" not in events and done >= updates // 2:
                    bot.go_down()
                    threading.Timer(outage, bot.come_back).start()
                    events["outage"] = round(time.perf_counter() - started, 1)
        answered = time.perf_counter() - started
        # Drain: every reply sent (or failed for good), and the fake Bot API back up.
        time.sleep(max(0.0, events.get("outage", 0) + outage - (time.perf_counter() - started)))
        while time.monotonic() < deadline:
            if not TelegramReply.objects.filter(status=ReplyStatus.PENDING).exists():
                break
            time.sleep(0.5)
        wall = time.perf_counter() - started
        ids = range(1, updates + 1)
        rows = {
            u: (s, a)
            for u, s, a in TelegramUpdate.objects.filter(update_id__in=ids).values_list(
                "update_id", "status", "attempts"
            )
        }
        failed_replies = TelegramReply.objects.filter(update__update_id__in=ids, status=ReplyStatus.FAILED).count()
    finally:
        bot.come_back()
        stop(delivery)
        stop(server)
        log = server_log(server, tail=None) + server_log(delivery, tail=None)
        server.log.close()
        delivery.log.close()
    per_update = Counter(
        -m["chat_id"] - CHAT_BASE for m in bot.sent_messages() if isinstance(m.get("chat_id"), int) and m["chat_id"] < 0
    )
    completed = [u for u in ids if rows.get(u, ("", 0))[0] == UpdateStatus.DONE]
    lost = [u for u in ids if u not in completed or per_update.get(u, 0) == 0]
    return {
        "updates": updates,
        "runs_completed": len(completed),
        "runs_restarted": sum(1 for u in ids if rows.get(u, ("", 0))[1] > 1),
        "replies_sent": sum(per_update.get(u, 0) for u in ids),
        "duplicate_replies": sum(max(0, per_update.get(u, 0) - 1) for u in ids),
        "lost_updates": len(lost),
        "first_lost": lost[:5],
        "killed_processes": 1 if "killed" in events else 0,
        "killed_at_s": events.get("killed", (None, None))[1],
        "bot_api_down_s": outage,
        "bot_api_down_at_s": events.get("outage"),
        "http_tries": sum(tries),
        "requests_cut": len(cut),
        "gave_up": statuses.get("gave up", 0),
        "replies_failed": failed_replies,
        "answered_s": answered,
        "wall_s": wall,
        "errors_logged": sum(1 for line in log.splitlines() if " ERROR " in line),
    }
