"""Cluster benchmark: two servers, two Celery workers and a beat on one PostgreSQL database.

    python -m bench.cluster [--updates 200] [--facts 300] [--probes 20] [--reminders 300] [--settle 30]
                            [--database-url postgres://postgres@127.0.0.1:5432/postgres]
                            [--broker redis://127.0.0.1:6379/0] [--preload-facts 0] [--preload-owners 1000]
                            [--vector-pool 2000] [--vector-cache-mb MB] [--json]

Makes a throw-away PostgreSQL database, starts two gunicorn servers (A and B, each --server-workers
processes of 4 threads, as two machines), two Celery workers (solo pool: one process each, as two
worker machines) and one beat, all with ENGRAM_TASK_BROKER set, and measures:

- load: Telegram updates to the demo workflow through both servers, half each, while a `manage.py`
  command writes --facts facts; then, --settle seconds after the load stops, how many documents are
  still pending;
- embeddings per document version: how often each (document, text) version was given to the model,
  across every process (each logs what it embeds: memory/recall/claims.py, note_embedding); 1.00
  means once each. Beside it the raw figures of the model's texts (model_calls below);
- freshness: a message sent on A, recall (vector mode) polled on B until its episode is found, p50/p95;
- reminders: --reminders due at once, delivered by the beat's `workflows.deliver_reminders` through
  the fake Telegram Bot API; the worker running the delivery is killed (SIGKILL) a third of the way
  through; delivered and duplicated sends are counted at the fake Bot API;
- memory of each process with its children at the end: RSS, and PSS (shared pages divided between
  the processes that share them), with its vector cache's figures (/healthz for a server, the
  `vector_cache` remote-control command for a worker). With --preload-facts N, N facts with their
  vectors are stored before the servers start, and before the memory is read every worker links every
  one of them and every server recalls for every person they belong to (bench/cluster/preload.py);
  the memory is also read before that (memory_mb_before_touch). --vector-cache-mb sets every
  process's MEMORY["VECTOR_CACHE_MB"] (which counts the model a process runs: its `model_bytes`), so
  that a store of a few tens of thousands of facts fills the workers' caches.

The forget trials are bench/cluster/forget.py's (also runnable alone: python -m bench.cluster.forget).
"""

import argparse
import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..support.scratch import REPO, machine_reference, scratch_django
from ..support.servers import SECRET, TOKEN, free_port, process_tree, server_log, text_for, wait_until_serving
from .preload import preload, touch

SETTINGS = """
import os
from config.settings import *  # noqa
MEMORY = {{**MEMORY, "TASK_PERIODS": {{"embed_pending": 10, "consolidate": 60, "promote": None, "prune": None,
          "deliver_reminders": 2}}}}
{cap}WORKFLOWS = {{**WORKFLOWS, "REMINDER_LEASE_SECONDS": {lease}}}
# The document versions each process gives the model (memory/recall/claims.py, note_embedding): one
# file per process, so that no two processes append to one file.
LOGGING["formatters"]["embedded"] = {{"format": "%(process)d\t%(message)s"}}
LOGGING["handlers"]["embedded"] = {{"class": "logging.FileHandler", "formatter": "embedded", "delay": True,
                                   "filename": os.path.join({data!r}, f"embedded-{{os.getpid()}}.log")}}
LOGGING["loggers"]["engram.memory.embedded"] = {{"handlers": ["embedded"], "level": "DEBUG", "propagate": False}}
"""


class CountingEmbeddings:
    """The configured local model (or, without it, LangChain's deterministic fake), noting each text
    it is given as a document in the file ENGRAM_BENCH_EMBED_LOG: one line per text, every process."""

    def __init__(self, **kwargs):
        from memory.embedding.embedder import local_model_installed

        if local_model_installed():
            from memory.embedding.embedder import LocalMiniLMEmbeddings

            self.inner = LocalMiniLMEmbeddings(**kwargs)
        else:
            from langchain_core.embeddings import DeterministicFakeEmbedding

            self.inner = DeterministicFakeEmbedding(size=384)
        self.model_id = f"counting:{type(self.inner).__name__}"

    def embed_documents(self, texts):
        from memory.recall.claims import text_digest

        with open(os.environ["ENGRAM_BENCH_EMBED_LOG"], "a") as log:
            log.writelines(f"{os.getpid()}\t{text_digest(text)}\n" for text in texts)
        return self.inner.embed_documents(texts)

    def embed_query(self, text):
        return self.inner.embed_query(text)


def _spawn(command, env, log_path):
    log = open(log_path, "w")
    proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    proc.log_path = log_path
    return proc


def _stop(proc, timeout=20):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _memory_mb(pid):
    """RSS and PSS of a process with its descendants, in MB, and how many processes they are.

    RSS counts a page shared by several processes (libraries, the model's weights mapped from their
    file, pages a fork left shared) once in each; PSS (/proc/PID/smaps_rollup) divides it between them.
    """
    rss = pss = processes = 0
    for current in process_tree(pid):
        try:
            rollup = Path(f"/proc/{current}/smaps_rollup").read_text().splitlines()
        except OSError:
            continue
        fields = {line.split(":")[0]: int(line.split()[1]) for line in rollup[1:]}
        rss, pss, processes = rss + fields.get("Rss", 0), pss + fields.get("Pss", 0), processes + 1
    return {"rss": round(rss / 1024, 1), "pss": round(pss / 1024, 1), "processes": processes}


def _worker_bound_mb(cap=None):
    """What a worker should stay within: its vector cap (MEMORY["VECTOR_CACHE_MB"], `cap` when the run
    sets it) + 150 MB."""
    from memory.conf import memory_settings

    if cap is None:
        cap = memory_settings.VECTOR_CACHE_MB
    return None if cap is None else float(cap) + 150


def _percentile(values, share):
    values = sorted(values)
    return values[max(0, int(round(share * len(values))) - 1)] if values else None


class Cluster:
    """The processes of the run, started from this process's environment plus `env`."""

    def __init__(self, args, env, data):
        self.args, self.env, self.data = args, env, data
        self.servers, self.workers, self.beat, self.own_queues = {}, [], None, []

    def start(self):
        for name in ("A", "B"):
            port = free_port()
            command = [sys.executable, "-m", "gunicorn", "--workers", str(self.args.server_workers), "--threads", "4"]
            command += ["--bind", f"127.0.0.1:{port}", "config.wsgi:application"]
            log = tempfile.TemporaryFile("w+")
            proc = subprocess.Popen(command, env=self.env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log, text=True)
            proc.log = log
            self.servers[name] = (proc, port)
        celery = [sys.executable, "-m", "celery", "--workdir", str(REPO / "platform"), "-A", "config"]
        for n in (1, 2):
            # Each worker also listens on a queue of its own, through which the memory trial reaches
            # every worker (preload.touch).
            own = f"{self.env['ENGRAM_TASK_QUEUE']}-w{n}"
            self.own_queues.append(own)
            command = [
                *celery,
                "worker",
                "-P",
                "solo",
                "-Q",
                f"{self.env['ENGRAM_TASK_QUEUE']},{own}",
                "-n",
                f"w{n}@%h",
                "--without-mingle",
                "--without-gossip",
            ]
            self.workers.append(_spawn([*command, "-l", "info"], self.env, self.data / f"worker-{n}.log"))
        beat = [*celery, "beat", "-s", str(self.data / "beat-schedule"), "-l", "info"]
        self.beat = _spawn(beat, self.env, self.data / "beat.log")
        for proc, port in self.servers.values():
            wait_until_serving(proc, port, timeout=120)

    def url(self, name):
        return f"http://127.0.0.1:{self.servers[name][1]}"

    def memory(self):
        """Each process's memory (RSS, PSS) and its vector cache's figures (bytes held, owners, loads...)."""
        from config.celery import app

        from .preload import server_cache, worker_caches

        report = {f"server {name}": _memory_mb(proc.pid) for name, (proc, _) in self.servers.items()}
        for name in self.servers:
            report[f"server {name}"]["cache"] = server_cache(self.url(name))
        caches = worker_caches(app, timeout=30)
        for n, worker in enumerate(self.workers, 1):
            if worker.poll() is None:
                report[f"worker {n}"] = {
                    **_memory_mb(worker.pid),
                    "cache": next((stats for name, stats in caches.items() if name.startswith(f"w{n}@")), None),
                }
            else:
                report[f"worker {n}"] = "killed"
        report["beat"] = _memory_mb(self.beat.pid)
        return report

    def stop(self):
        for proc in [self.beat, *self.workers]:
            if proc is not None:
                _stop(proc)
        for proc, _ in self.servers.values():
            _stop(proc)
            errors = [line for line in server_log(proc, None).splitlines() if " ERROR " in line]
            self.errors_logged = getattr(self, "errors_logged", []) + errors
            proc.log.close()


def _webhook_sender(cluster, slug):
    import httpx

    local = threading.local()
    headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET}

    def send(server, update):
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=0))
        try:
            response = local.client.post(
                f"{cluster.url(server)}/telegram/{slug}/webhook/", json=update, headers=headers
            )
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None if response.status_code == 200 and response.json().get("status") == "ran" else response.status_code

    return send


def _pending():
    from memory.service import MemoryService

    return MemoryService().pending_vectors()


def load(cluster, args, send):
    """Updates through both servers and facts from a `manage.py` command at once; then the backlog."""
    from workflows.channels.fake_telegram import telegram_update

    write = (
        "from memory.service import MemoryService\nmemory = MemoryService()\n"
        f"for n in range({args.facts}):\n"
        "    memory.set_fact(f'cli_note_{n}', f'a note from the command line, number {n}, about the garden', scope='global')\n"
    )
    command = subprocess.Popen(
        [sys.executable, "manage.py", "shell", "-v", "0", "-c", write], env=cluster.env, cwd=REPO
    )
    plan = [("AB"[n % 2], telegram_update(n + 1, 5000 + n % 40, text_for(n, n % 40))) for n in range(args.updates)]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=4) as pool:
        errors = [e for e in pool.map(lambda item: send(*item), plan) if e]
    command.wait()
    load_seconds = time.perf_counter() - started
    pending_at_stop = _pending()
    time.sleep(args.settle)
    return {
        "updates": args.updates,
        "facts_by_manage_py": args.facts,
        "update_errors": len(errors),
        "load_s": round(load_seconds, 1),
        "pending_at_load_stop": pending_at_stop,
        f"pending_{args.settle:g}s_after_load": _pending(),
    }


def freshness(cluster, args, send):
    """Send a unique message on A; poll recall (vector mode) on B until its episode is a hit."""
    import httpx
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from memory.models import ChannelIdentity, RecallDocument

    staff, _ = get_user_model().objects.get_or_create(username="cluster-bench", defaults={"is_staff": True})
    token, _ = Token.objects.get_or_create(user=staff)
    headers = {"Authorization": f"Token {token.key}"}
    seconds, misses = [], 0
    with httpx.Client(timeout=30) as client:
        for n in range(args.probes):
            from workflows.channels.fake_telegram import telegram_update

            word = f"zq{uuid.uuid4().hex[:8]}"
            user = 900_000 + n
            text = f"my locker code is {word} and my bicycle is {['red', 'green', 'blue'][n % 3]}"
            if send("A", telegram_update(800_000 + n, user, text)):
                misses += 1
                continue
            written = time.perf_counter()
            person = ChannelIdentity.objects.get(channel="telegram", external_id=str(user)).user_id
            owner = RecallDocument.objects.filter(text__contains=word).values_list("owner", flat=True).first() or ""
            agent = owner.split("agent:", 1)[1] if "agent:" in owner else ""
            params = {"q": f"locker code {word}", "mode": "vector", "user": person, "limit": 5}
            if agent:
                params["agent_id"] = agent
            while time.perf_counter() - written < 30:
                found = client.get(f"{cluster.url('B')}/api/v1/recall/", params=params, headers=headers)
                if found.status_code == 200 and word in found.text:
                    seconds.append(time.perf_counter() - written)
                    break
                time.sleep(0.05)
            else:
                misses += 1
    return {
        "probes": args.probes,
        "found": len(seconds),
        "missed": misses,
        "p50_s": round(statistics.median(seconds), 3) if seconds else None,
        "p95_s": round(_percentile(seconds, 0.95), 3) if seconds else None,
    }


def reminders(cluster, args, bot):
    """Reminders due at once; the worker delivering them is killed a third of the way through."""
    from memory.models import PeriodicRun

    from ..reminders import seed

    before = len(bot.sent_messages())
    seed(args.reminders, 50)
    started, killed = time.perf_counter(), None
    while time.perf_counter() - started < args.reminder_timeout:
        sent = len(bot.sent_messages()) - before
        if killed is None and sent >= args.reminders // 3:
            run = PeriodicRun.objects.filter(name="deliver_reminders").order_by("-period_start").first()
            pid = int(run.started_by.rsplit(":", 1)[1]) if run else None
            for n, worker in enumerate(cluster.workers, 1):
                if worker.pid == pid:
                    worker.send_signal(signal.SIGKILL)
                    worker.wait()
                    killed = {"worker": n, "after_sent": sent}
        texts = [m["text"] for m in bot.sent_messages()[before:]]
        if len(set(texts)) >= args.reminders:
            break
        time.sleep(0.2)
    time.sleep(1)  # a send still in flight would show up as a duplicate
    counts = collections.Counter(m["text"] for m in bot.sent_messages()[before:])
    return {
        "due": args.reminders,
        "delivered": len(counts),
        "duplicates": sum(n - 1 for n in counts.values()),
        "killed": killed,
        "seconds": round(time.perf_counter() - started, 1),
    }


def _embedded_versions(data):
    """[(pid, source, id, digest, pieces)]: every document version a process gave the model, from the
    files the processes' "engram.memory.embedded" loggers wrote (memory/recall/claims.py)."""
    versions = []
    for path in sorted(data.glob("embedded-*.log")):
        for line in path.read_text().splitlines():
            pid, _, message = line.partition("\t")
            source, *items = message.split()
            for item in items:
                doc_id, digest, pieces = item.split(":")
                versions.append((int(pid), source, int(doc_id), digest, int(pieces)))
    return versions


def model_calls(data):
    """How often each document version was embedded, and what the model was given for them.

    The figure the bench is about, `embeddings_per_document_version`: the (document, text) versions
    the processes gave the model (each process logs them as it embeds: memory/recall/claims.py,
    note_embedding), counted with repeats, over the distinct ones. 1.00 means every version that got
    embedded was embedded once across all processes; a version given twice (two workers, a retry, a
    request thread and a worker) counts twice. A version is a document's text at one time: a fact
    whose value changed has two, each needed a vector while it was current. None is missing when,
    besides, nothing is pending at the end and every stored document's vector is of a version in the
    log (`stored_documents_not_embedded_by_a_worker`).

    Raw model figures beside it: `model_texts` is what the model was given (pieces: a long episode
    is several), against the pieces of the versions embedded and of the documents stored now. Below
    1, a process gave an identical piece once for several documents (its piece cache); a text given
    by two processes for two documents (`texts_given_by_more_than_one_process`) is each process's once.
    """
    from memory.conf import memory_settings
    from memory.embedding.embedder import split_pieces, without_date_line
    from memory.models import RecallDocument
    from memory.recall.claims import text_digest

    lines = (data / "embed.log").read_text().splitlines() if (data / "embed.log").exists() else []
    given = collections.Counter(line.split("\t")[1] for line in lines)
    givers = collections.defaultdict(set)
    for line in lines:
        pid, digest = line.split("\t")
        givers[digest].add(pid)
    versions = _embedded_versions(data)
    times = collections.Counter((source, doc_id, digest) for _, source, doc_id, digest, _ in versions)
    pieces = {(source, doc_id, digest): n for _, source, doc_id, digest, n in versions}
    processes = collections.defaultdict(set)
    for pid, source, doc_id, digest, _ in versions:
        processes[(source, doc_id, digest)].add(pid)
    words = int(memory_settings.EMBED_PIECE_WORDS)
    stored, needed = set(), collections.Counter()
    for doc_id, text in RecallDocument.objects.exclude(text="").exclude(embedding=None).values_list("id", "text"):
        stored.add(("recall", doc_id, text_digest(text)))
        needed.update(text_digest(piece) for piece in split_pieces(without_date_line(text), words))
    version_pieces = sum(pieces.values())
    for_stored = sum(given[h] for h in needed)
    return {
        "document_versions_embedded": len(times),
        "embeddings_per_document_version": round(sum(times.values()) / len(times), 3) if times else None,
        "document_versions_embedded_twice": sum(1 for n in times.values() if n > 1),
        "document_versions_embedded_by_two_processes": sum(1 for pids in processes.values() if len(pids) > 1),
        "versions_embedded_not_current": len(times.keys() - stored),
        "documents_stored_with_a_vector": len(stored),
        "stored_documents_not_embedded_by_a_worker": len(stored - times.keys()),
        "model_texts": len(lines),
        "model_texts_per_piece_of_versions_embedded": round(len(lines) / version_pieces, 3) if version_pieces else None,
        # The figure this bench printed first (as model_calls_per_document): texts given that stored
        # documents hold now, over their pieces; and the same over their distinct pieces.
        "model_texts_per_stored_piece": round(for_stored / sum(needed.values()), 3) if needed else None,
        "model_texts_per_distinct_stored_piece": round(for_stored / len(needed), 3) if needed else None,
        "texts_given_by_more_than_one_process": sum(1 for pids in givers.values() if len(pids) > 1),
        "embedded_by_pid": dict(collections.Counter(str(pid) for pid, *_ in versions)),
    }


def forget_trials(cluster, args):
    """Forgetting a person on one server while another runs their workflows (bench/cluster/forget.py):
    two more servers of its own (with a slow fake chat model, so runs stay in flight) on the same
    database, beside the cluster's servers and workers."""
    from .forget import run

    return run(cluster.env["DATABASE_URL"], trials=args.forget)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=200, help="Telegram updates, half through each server")
    parser.add_argument("--facts", type=int, default=300, help="facts a manage.py command writes meanwhile")
    parser.add_argument("--probes", type=int, default=20, help="freshness probes (write on A, recall on B)")
    parser.add_argument("--reminders", type=int, default=300, help="reminders due at once")
    parser.add_argument("--reminder-timeout", type=float, default=180, help="seconds to wait for the reminders")
    parser.add_argument("--lease", type=float, default=15, help="the reminders' lease in seconds (default 15)")
    parser.add_argument("--settle", type=float, default=30, help="seconds after the load before counting pending")
    parser.add_argument("--forget", type=int, default=20, help="forget trials (bench/cluster/forget.py)")
    parser.add_argument("--server-workers", type=int, default=1, help="gunicorn processes per server (4 threads)")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--preload-facts", type=int, default=0, help="facts (with vectors) stored before the trials (preload.py)"
    )
    parser.add_argument("--preload-owners", type=int, default=1000, help="people the preloaded facts are spread over")
    parser.add_argument("--vector-pool", type=int, default=2000, help="distinct texts the model embeds for them")
    parser.add_argument(
        "--vector-cache-mb", type=float, default=None, help="MEMORY['VECTOR_CACHE_MB'] of every process of the run"
    )
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object")
    args = parser.parse_args(argv)
    if args.vector_cache_mb is not None and args.vector_cache_mb < 0:
        parser.error("--vector-cache-mb must be a number of megabytes >= 0")
    for name in ("preload_facts", "preload_owners", "vector_pool"):
        if getattr(args, name) < (0 if name == "preload_facts" else 1):
            parser.error(f"--{name.replace('_', '-')} must be a positive number")

    def say(message):
        print(message, file=sys.stderr, flush=True)

    if not args.database_url.startswith("postgres"):
        parser.error("--database-url must name a PostgreSQL server: the cluster shares one database")

    from workflows.channels.fake_telegram import FakeBotAPI

    data = Path(tempfile.mkdtemp(prefix="engram-cluster-"))
    cap = "" if args.vector_cache_mb is None else f'MEMORY["VECTOR_CACHE_MB"] = {args.vector_cache_mb!r}\n'
    (data / "cluster_settings.py").write_text(SETTINGS.format(lease=args.lease, data=str(data), cap=cap))
    results = {"machine": machine_reference()}
    with FakeBotAPI() as bot:
        os.environ.update(
            TELEGRAM_API_BASE=bot.url,
            TELEGRAM_BOT_TOKEN=TOKEN,
            TELEGRAM_WEBHOOK_SECRET=SECRET,
            ENGRAM_TASK_BROKER=args.broker,
            ENGRAM_TASK_QUEUE=f"engram-bench-{uuid.uuid4().hex[:8]}",
            ENGRAM_EMBEDDINGS="bench.cluster.trials.CountingEmbeddings",
            ENGRAM_BENCH_EMBED_LOG=str(data / "embed.log"),
        )
        os.environ.pop("ENGRAM_CHAT_MODEL", None)
        with scratch_django(args.database_url):
            from django.db import connections

            from workflows.demo import ensure_demo_workflow

            workflow, _ = ensure_demo_workflow()
            preloaded = None
            if args.preload_facts:
                preloaded = preload(args.preload_facts, args.preload_owners, args.vector_pool, say=say)
                results["preload"] = {k: v for k, v in preloaded.items() if k != "user_ids"}
            connections.close_all()
            env = {
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "cluster_settings",
                "PYTHONPATH": os.pathsep.join([str(data), str(REPO / "platform"), str(REPO)]),
            }
            cluster = Cluster(args, env, data)
            try:
                cluster.start()
                send = _webhook_sender(cluster, workflow.slug)
                results["load"] = load(cluster, args, send)
                results["model_calls"] = model_calls(data)
                results["freshness"] = freshness(cluster, args, send)
                results["forget"] = forget_trials(cluster, args)
                if preloaded:
                    results["memory_mb_before_touch"] = cluster.memory()
                    results["touch"] = touch(cluster, preloaded, say=say)
                results["memory_mb"] = cluster.memory()
                results["worker_bound_mb"] = _worker_bound_mb(args.vector_cache_mb)
                results["reminders"] = reminders(cluster, args, bot)
            finally:
                cluster.stop()
                connections.close_all()
            results["server_errors_logged"] = len(cluster.errors_logged)
            results["first_server_errors"] = cluster.errors_logged[:3]
    if args.json:
        print(json.dumps(results))
    else:
        from rich.console import Console

        Console().print_json(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
