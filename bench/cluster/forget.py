"""Forget race benchmark: forgetting a person on server A while server B runs their workflows.

    python -m bench.cluster.forget --database-url postgres://user@host:port/any [--trials 20] [--runs 4]
                                [--workers 1] [--model-seconds 0.6] [--mode keyword|hybrid] [--json]

Two gunicorn servers (A and B, as two machines) on one database, with the demo workflow behind the
Telegram webhook, a fake Bot API taking the replies and a fake OpenAI-compatible chat model that takes
MODEL_SECONDS per answer (both in this process: the outside world). Each trial: a new person tells B
who they are (one run, finished), then sends RUNS messages with a secret at once; while those runs are
in flight (a random 0.1 to 0.9 s later) an operator forgets the person on A over the REST API. Once
every run has answered, `memory verify-erasure` looks for the person (their Telegram id, name, memory
user id and the secret). A run whose message reached B after the forget made a new person of the
same Telegram account (a new contact, not a trace of the old one): such trials are counted as
`recreated` and that new person is forgotten too before the check.

Prints forgets answered 200, 409 and 500 (and others), traces found after the in-flight runs drained,
and the runs that failed. `run(database_url, ...)` is what bench.cluster calls: `database_url` names a
migrated database (PostgreSQL for the trial as the issue ran it; SQLite works too).
"""

import argparse
import json
import os
import random
import re
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..support.scratch import REPO, add_mode_argument, add_scratch_arguments, machine_reference, scratch_django

TOKEN = "bench:token"
SECRET = "bench-secret"
FIRST_TELEGRAM_ID = 880_000_000


class FakeChatModel:
    """An OpenAI-compatible /chat/completions on 127.0.0.1 that answers after `seconds` (a model thinking)."""

    def __init__(self, seconds):
        seconds = float(seconds)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                time.sleep(seconds)
                body = json.dumps(
                    {
                        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": "slow-fake",
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": "Noted."}, "finish_reason": "stop"}
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def _django_on(database_url):
    """Django in this process, on `database_url` (left as it is when the caller already set it up)."""
    from django.conf import settings

    if settings.configured:
        return
    sys.path.insert(0, str(REPO / "platform"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ["DATABASE_URL"] = database_url
    import django

    django.setup()


def _operator_token():
    """A staff user's REST API token (made once per database)."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    user, _ = get_user_model().objects.get_or_create(
        username="forget-race-operator", defaults={"is_staff": True, "is_superuser": True}
    )
    return Token.objects.get_or_create(user=user)[0].key


def _verify_erasure(identifiers, user_ids, texts):
    """Traces `memory verify-erasure` reports: [line]."""
    from io import StringIO

    from django.core.management import CommandError, call_command

    out = StringIO()
    args = ["memory", "verify-erasure", *identifiers]
    for user_id in user_ids:
        args += ["--user-id", str(user_id)]
    for text in texts:
        args += ["--text", text]
    try:
        call_command(*args, stdout=out, stderr=StringIO())
    except CommandError:
        pass
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    return [] if len(lines) == 1 and lines[0].startswith("0 traces") else lines


def run(
    database_url,
    trials=20,
    *,
    runs=4,
    workers=1,
    model_seconds=0.6,
    forget_after=(0.1, 0.9),
    seed=43,
    progress=None,
):
    """Run the trials on `database_url` (migrated); returns a dict of counts (see the module's docstring)."""
    import httpx
    from django.db import connections

    from memory.service import MemoryService
    from workflows.channels.fake_telegram import FakeBotAPI, telegram_update
    from workflows.demo import ensure_demo_workflow

    from ..support.servers import free_port, server_log, start_server, wait_until_serving

    _django_on(database_url)
    workflow, _ = ensure_demo_workflow()
    token = _operator_token()
    # verify-erasure looks at every user_id column, the REST token's (a Django user's id) too: a memory
    # user made first keeps the people of the trials from sharing the operator's id 1.
    MemoryService().get_or_create_user("bench", "forget-race-bystander", display_name="Bystander")
    connections.close_all()
    rng = random.Random(seed)
    results = {
        "trials": trials,
        "runs_per_trial": runs,
        "forget_200": 0,
        "forget_409": 0,
        "forget_500": 0,
        "forget_other": 0,
        "runs_failed": 0,
        "recreated": 0,
        "traces": 0,
        "trials_with_traces": 0,
        "first_traces": [],
    }
    servers = []
    saved_env = dict(os.environ)
    with (
        FakeBotAPI() as bot,
        FakeChatModel(model_seconds) as model,
        tempfile.TemporaryDirectory(prefix="engram-forget-race-") as data,
    ):
        os.environ.update(
            DATABASE_URL=database_url,
            ENGRAM_DATA_DIR=data,
            TELEGRAM_API_BASE=bot.url,
            TELEGRAM_BOT_TOKEN=TOKEN,
            TELEGRAM_WEBHOOK_SECRET=SECRET,
            ENGRAM_CHAT_MODEL="slow-fake",
            ENGRAM_CHAT_BASE_URL=model.url,
            ENGRAM_CHAT_API_KEY="none",
        )
        try:
            ports = [free_port(), free_port()]
            servers = [start_server(port, workers) for port in ports]
            for server, port in zip(servers, ports):
                wait_until_serving(server, port)
            a, b = (f"http://127.0.0.1:{port}" for port in ports)
            hook = f"{b}/telegram/{workflow.slug}/webhook/"
            headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
            auth = {"Authorization": f"Token {token}"}
            client = httpx.Client(timeout=120, limits=httpx.Limits(max_keepalive_connections=0))
            task = progress.add_task(f"{trials} forget trials", total=trials) if progress else None
            update_id = rng.randrange(10**6, 10**7)
            for _ in range(trials):
                telegram_id = FIRST_TELEGRAM_ID + rng.randrange(10**6)
                name = f"Racer{uuid.uuid4().hex[:6]}"
                secret = f"race-secret-{uuid.uuid4().hex[:10]}"
                update_id += 1
                client.post(
                    hook,
                    json=telegram_update(update_id, telegram_id, f"my name is {name}", first_name=name),
                    headers=headers,
                )
                person = MemoryService().find_user("telegram", str(telegram_id))
                connections.close_all()
                if person is None:
                    results["runs_failed"] += 1
                    continue
                plan = []
                for i in range(runs):
                    update_id += 1
                    plan.append(telegram_update(update_id, telegram_id, f"my pin is {secret} ({i})", first_name=name))

                def send(update):
                    try:
                        response = client.post(hook, json=update, headers=headers)
                        return response.status_code == 200 and response.json().get("status") == "ran"
                    except (httpx.HTTPError, ValueError):
                        return False

                with ThreadPoolExecutor(max_workers=runs) as pool:
                    sent = [pool.submit(send, update) for update in plan]
                    time.sleep(rng.uniform(*forget_after))
                    forget = client.post(
                        f"{a}/api/v1/memory-users/batch-delete/",
                        json={"ids": [person.pk], "cascade": True},
                        headers=auth,
                    )
                    ran = [f.result() for f in sent]  # drained: every in-flight run has answered
                status = forget.status_code
                key = {200: "forget_200", 409: "forget_409", 500: "forget_500"}.get(status, "forget_other")
                results[key] += 1
                results["runs_failed"] += ran.count(False)
                user_ids = [person.pk]
                again = MemoryService().find_user("telegram", str(telegram_id))
                if status == 200 and again is not None:
                    # A message that reached B after the forget: a new contact, forgotten in turn.
                    results["recreated"] += 1
                    user_ids.append(again.pk)
                    MemoryService().delete_users([again.pk], cascade=True)
                elif status != 200:  # not forgotten (nothing was deleted): forgotten now, then checked
                    MemoryService().delete_users([person.pk], cascade=True)
                traces = _verify_erasure([f"telegram:{telegram_id}", name], user_ids, [secret])
                connections.close_all()
                results["traces"] += len(traces)
                results["trials_with_traces"] += bool(traces)
                results["first_traces"] += traces[: max(0, 5 - len(results["first_traces"]))]
                if progress:
                    progress.advance(task)
            client.close()
        finally:
            logs = []
            for server in servers:
                server.terminate()
                try:
                    server.wait(timeout=15)
                except Exception:  # noqa: BLE001  (a server that will not stop is killed)
                    server.kill()
                    server.wait()
                logs.append(server_log(server, tail=None))
                server.log.close()
            os.environ.clear()
            os.environ.update(saved_env)
    errors_logged = [line for line in "\n".join(logs).splitlines() if " ERROR " in line]
    log = "\n".join(logs)
    results["server_errors_logged"] = len(errors_logged)
    results["first_errors_logged"] = errors_logged[:5]
    # What the errors were, by kind (ids and times taken out): refused writes of a person forgotten
    # mid-run are expected; anything else is worth a look.
    kinds = Counter(re.sub(r"\d+", "N", line.split(" ERROR ", 1)[1])[:90] for line in errors_logged)
    results["errors_logged_by_kind"] = dict(kinds.most_common(8))
    results["internal_server_errors"] = log.count("Internal Server Error")
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.cluster.forget", description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="forget trials (default 20)")
    parser.add_argument("--runs", type=int, default=4, help="runs in flight per trial (default 4)")
    parser.add_argument("--workers", type=int, default=1, help="processes per server, 4 threads each (default 1)")
    parser.add_argument("--model-seconds", type=float, default=0.6, help="the fake chat model's time (default 0.6)")
    add_scratch_arguments(parser, seed=False)
    add_mode_argument(parser)
    args = parser.parse_args(argv)
    if min(args.trials, args.runs, args.workers) < 1 or args.model_seconds < 0:
        parser.error("--trials, --runs and --workers must be positive, --model-seconds not negative")
    from rich.console import Console
    from rich.progress import Progress

    with scratch_django(args.database_url, mode=args.mode), Progress(console=Console(stderr=True)) as progress:
        from django.db import connection

        database = connection.vendor
        results = run(
            os.environ["DATABASE_URL"],
            args.trials,
            runs=args.runs,
            workers=args.workers,
            model_seconds=args.model_seconds,
            progress=progress,
        )
    results.update(database=database, mode=args.mode)
    if args.json:
        print(json.dumps(results))
        return 0
    console = Console()
    console.print(
        f"Forget race ({database}, {args.mode}): {results['trials']} trials, {results['runs_per_trial']} runs in "
        f"flight on B while A forgets; forgets answered 200: {results['forget_200']}, 409: {results['forget_409']}, "
        f"500: {results['forget_500']}, other: {results['forget_other']}; traces after drain: {results['traces']} "
        f"(in {results['trials_with_traces']} trials); people made again by a later message: "
        f"{results['recreated']}; runs failed: {results['runs_failed']}."
    )
    for line in results["first_traces"]:
        console.print(f"[red]trace:[/] {line}")
    console.print(machine_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
