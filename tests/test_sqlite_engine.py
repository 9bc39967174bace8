"""The SQLite engine queues this process's write transactions on one lock (memory/sqlite_engine/base.py)."""

import threading
import time

import pytest
from django.db import OperationalError, connection, connections, transaction

from memory.models import MemoryUser
from memory.sqlite_engine.base import WalCheckpointer, write_lock

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _sqlite_only():
    if connection.vendor != "sqlite":
        pytest.skip("the write queue is part of the SQLite engine; PostgreSQL locks rows itself")


def _lock():
    return write_lock(connection.settings_dict["NAME"])


def test_a_transaction_holds_the_write_lock_until_it_commits():
    assert not _lock().locked()
    with transaction.atomic():
        MemoryUser.objects.create(canonical_id="test:1")
        assert _lock().locked()
        with transaction.atomic():  # a savepoint takes nothing more
            MemoryUser.objects.create(canonical_id="test:2")
    assert not _lock().locked()
    assert MemoryUser.objects.count() == 2


def test_a_rolled_back_transaction_releases_the_write_lock():
    with pytest.raises(ValueError), transaction.atomic():
        MemoryUser.objects.create(canonical_id="test:1")
        raise ValueError("undo")
    assert not _lock().locked()
    assert not MemoryUser.objects.exists()


def test_closing_a_connection_inside_a_transaction_releases_the_write_lock():
    with transaction.atomic():
        MemoryUser.objects.create(canonical_id="test:1")
        connection.close()
        assert not _lock().locked()
    assert not MemoryUser.objects.exists()


def test_a_waiting_writer_goes_on_when_the_one_before_commits():
    holding, release, written, errors = threading.Event(), threading.Event(), [], []

    def first():
        try:
            with transaction.atomic():
                MemoryUser.objects.create(canonical_id="test:first")
                holding.set()
                release.wait(10)
        finally:
            connections.close_all()

    def second():
        try:
            holding.wait(10)
            with transaction.atomic():
                written.append(MemoryUser.objects.filter(canonical_id="test:first").exists())
                MemoryUser.objects.create(canonical_id="test:second")
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    holding.wait(10)
    release.set()
    for t in threads:
        t.join(20)
    assert errors == []
    assert written == [True]  # and starts after the first committed, seeing its row
    assert set(MemoryUser.objects.values_list("canonical_id", flat=True)) == {"test:first", "test:second"}


def test_a_writer_that_waits_longer_than_the_timeout_fails_as_sqlite_would_and_writes_nothing():
    lock = _lock()
    options = connection.settings_dict["OPTIONS"]
    old_timeout = options.get("timeout")
    options["timeout"] = 0.05
    lock.acquire()  # another thread's transaction, as far as this connection can tell
    try:
        with pytest.raises(OperationalError, match="database is locked"):
            with transaction.atomic():
                MemoryUser.objects.create(canonical_id="test:late")
    finally:
        lock.release()
        options["timeout"] = old_timeout
    assert not lock.locked()
    assert not MemoryUser.objects.exists()


def test_commits_leave_wal_checkpoints_to_a_background_thread():
    """Writers only append to the WAL; the process's checkpointer copies it back into the database."""
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA wal_autocheckpoint")
        assert cursor.fetchone()[0] == WalCheckpointer.BACKSTOP_PAGES
    checkpointer = connection.checkpointer
    assert checkpointer is WalCheckpointer.for_file(connection.settings_dict["NAME"])
    before = checkpointer.checkpoints
    for i in range(WalCheckpointer.CHECKPOINT_EVERY):
        with transaction.atomic():
            MemoryUser.objects.create(canonical_id=f"test:{i}")
    deadline = time.monotonic() + 10
    while checkpointer.checkpoints == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert checkpointer.checkpoints > before
    busy, wal_frames, copied = checkpointer.last_result
    assert wal_frames > 0 and copied > 0
