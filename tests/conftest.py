"""Shared fixtures of the Engram test suite.

Run on SQLite (default) or on PostgreSQL with
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/engram python -m pytest
Tests marked ``@pytest.mark.postgres`` are skipped unless the default database is PostgreSQL.
"""

import itertools
import threading

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from memory.backends import reset_backend
from memory.buffers import any_pending, flush_all
from memory.models import Fact
from memory.service import MemoryService

POSTGRES_SKIP_REASON = "needs PostgreSQL: set DATABASE_URL=postgres://..."

# Statements Django logs around transactions; they differ by database and by nesting (a test's
# own transaction turns BEGIN/COMMIT into SAVEPOINT/RELEASE), so query budgets leave them out.
_TRANSACTION_STATEMENTS = ("BEGIN", "SAVEPOINT", "RELEASE", "COMMIT", "ROLLBACK")


def pytest_configure(config):
    # WhiteNoise warns once per request handler that STATIC_ROOT (filled by collectstatic) is absent;
    # the site serves admin files through the finders instead, so the warning is noise in tests.
    config.addinivalue_line("filterwarnings", "ignore:No directory at:UserWarning")


def pytest_collection_modifyitems(config, items):
    """Skip tests marked `postgres` unless the default database is PostgreSQL."""
    if connection.vendor == "postgresql":
        return
    skip = pytest.mark.skip(reason=POSTGRES_SKIP_REASON)
    for item in items:
        if item.get_closest_marker("postgres") is not None:
            item.add_marker(skip)


@pytest.fixture
def requires_postgres():
    """For a test that needs PostgreSQL only for part of its body: request this fixture."""
    if connection.vendor != "postgresql":
        pytest.skip(POSTGRES_SKIP_REASON)


@pytest.fixture(scope="session", autouse=True)
def _no_session_left_on_the_test_database(django_db_setup, django_db_blocker):
    """Threads that served Django (event loops' worker threads, the embedding worker) keep their
    connections until they end, and PostgreSQL drops no database with sessions on it: end them before
    pytest-django drops the test database, so a run leaves none behind on the server."""
    yield
    with django_db_blocker.unblock():
        if connection.vendor != "postgresql":
            return
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )


@pytest.fixture(autouse=True)
def _access_counts_do_not_leak(db):
    """Start and end every test with empty access-count, recall-event and contradiction buffers.

    Ends by writing the buffer while the test's database is still there (this fixture depends on
    `db`, so it is torn down before the test's transaction is rolled back), then clears anything
    left, so counts noted by one test never land on a row of the next (SQLite reuses rolled-back ids).
    """
    flush_all()
    yield
    flush_all()
    assert not any_pending()


@pytest.fixture(autouse=True)
def _embed_inline(settings):
    """Writes embed inside their own transaction, as before the embedding worker: a test runs in a
    transaction that never commits, so a vector computed after the commit would never come. Tests of
    the worker itself set MEMORY["EMBED_ON_WRITE"] = "background" in a transactional test."""
    settings.MEMORY = {**getattr(settings, "MEMORY", {}), "EMBED_ON_WRITE": "inline"}


@pytest.fixture
def service(db):
    """A MemoryService on a fresh backend (no term statistics cached from earlier tests)."""
    reset_backend()
    svc = MemoryService()
    yield svc
    reset_backend()


@pytest.fixture
def user_factory(service):
    """Create memory users through the service: user_factory(name="ann", channel="test") -> MemoryUser."""
    counter = itertools.count(1)

    def make(name=None, *, channel="test", display_name=None):
        n = next(counter)
        external_id = name or f"user-{n}"
        user, created = service.get_or_create_user(
            channel, external_id, display_name=display_name if display_name is not None else external_id.title()
        )
        assert created, f"{channel}:{external_id} already existed"
        return user

    return make


class DataQueries(CaptureQueriesContext):
    """CaptureQueriesContext that can also list the statements other than transaction control."""

    @property
    def data(self):
        return [
            q["sql"] for q in self.captured_queries if not q["sql"].lstrip().upper().startswith(_TRANSACTION_STATEMENTS)
        ]


@pytest.fixture
def capture_data_queries():
    """`with capture_data_queries() as q: ...` then `q.data`: the statements run, BEGIN/SAVEPOINT/... left out."""
    return lambda: DataQueries(connection)


def hold_the_database(seconds, started, release=None):
    """Another writer holding the database (SQLite's write lock, PostgreSQL's fact table) on a
    connection of its own: `started` is set once it holds it, and it lets go when `release` is set or
    after `seconds`. Readers go on meanwhile; writers wait. Run it on a thread of its own."""
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                if connection.vendor == "postgresql":
                    cursor.execute(f"LOCK TABLE {Fact._meta.db_table} IN EXCLUSIVE MODE")
                else:
                    cursor.execute(f"UPDATE {Fact._meta.db_table} SET access_count = access_count WHERE id = 0")
            started.set()
            (release or threading.Event()).wait(seconds)
    finally:
        connections.close_all()


def database_url():
    """The test database as a DATABASE_URL, for a real second process on the same database."""
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
        return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    return f"sqlite:///{db['NAME']}"


def _run_in_threads(target, threads):
    """Run target(n) in `threads` threads that start together, each on its own DB connection.

    Returns the results in thread order; raises AssertionError listing any exceptions.
    """
    barrier = threading.Barrier(threads)
    results, errors = [None] * threads, []

    def run(n):
        try:
            barrier.wait(timeout=30)
            results[n] = target(n)
        except Exception as exc:  # noqa: BLE001  (reported below, with the others)
            errors.append(f"thread {n}: {exc!r}")
        finally:
            connection.close()

    workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not any(w.is_alive() for w in workers), "a thread hung"
    assert errors == [], errors
    return results


@pytest.fixture
def run_in_threads():
    """run_in_threads(target, threads): see _run_in_threads. Use with django_db(transaction=True)."""
    return _run_in_threads


# ----------------------------------------------------------------------------- workflows

BOT_TOKEN = "123456:TEST-token-never-logged"
WEBHOOK_SECRET = "s3cret-token"


@pytest.fixture(autouse=True)
def _workflow_settings(settings, tmp_path):
    """Every test gets its own checkpoint file, no chat model, and a Telegram setup pointing nowhere.

    On PostgreSQL the checkpointer lives in the test database; threads a test leaves there are
    deleted through the saver's public API, so user ids reused by later tests start clean.
    """
    from workflows.conversations.checkpointer import close_checkpointer, existing_checkpointer

    settings.WORKFLOWS = {
        "CHECKPOINT_PATH": tmp_path / "checkpoints.db",
        "CHAT_MODEL": None,
        "TELEGRAM_API_BASE": "http://127.0.0.1:9",
        "TELEGRAM_BOT_TOKEN": BOT_TOKEN,
        "TELEGRAM_WEBHOOK_SECRET": WEBHOOK_SECRET,
    }
    yield settings.WORKFLOWS
    saver = existing_checkpointer()
    if saver is not None and connection.vendor == "postgresql":
        for thread_id in {c.config["configurable"]["thread_id"] for c in saver.list(None)}:
            saver.delete_thread(thread_id)
    close_checkpointer()


@pytest.fixture
def fake_bot():
    """A fake Telegram Bot API on 127.0.0.1, set as WORKFLOWS["TELEGRAM_API_BASE"]."""
    from django.conf import settings as django_settings
    from django.test import override_settings

    from workflows.channels.fake_telegram import FakeBotAPI

    with FakeBotAPI() as bot:
        with override_settings(WORKFLOWS={**django_settings.WORKFLOWS, "TELEGRAM_API_BASE": bot.url}):
            yield bot


@pytest.fixture
def demo_workflow(db):
    from workflows.demo import ensure_demo_workflow

    workflow, _ = ensure_demo_workflow()
    return workflow


@pytest.fixture
def keyword_only(settings):
    """Recall without an embedder (MEMORY["EMBEDDINGS"] = None), whatever is installed."""
    settings.MEMORY = {**getattr(settings, "MEMORY", {}), "EMBEDDINGS": None}


# ----------------------------------------------------------------------------- operators


@pytest.fixture
def staff(django_user_model):
    """A staff member without any model permission: staff status alone opens the admin and the API."""
    return django_user_model.objects.create_user("operator", is_staff=True)


@pytest.fixture
def staff_client(client, staff):
    client.force_login(staff)
    return client


@pytest.fixture
def api(staff):
    """A DRF client authenticated with the staff member's token."""
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=staff).key}")
    return client


@pytest.fixture
def threads(demo_workflow):
    """Ann talked four times, Bob once: two threads with checkpoints in the saver."""
    from tests.workflow_helpers import talk

    # One checkpoint per turn (WORKFLOWS CHECKPOINT_DURABILITY "exit"): four turns, four checkpoints.
    for text in ["my name is Ann", "my city is Oslo", "hello", "what is my name?"]:
        ann = talk(demo_workflow, "ann", text)
    bob = talk(demo_workflow, "bob", "hi")
    return {"ann": ann.thread_id, "bob": bob.thread_id}
