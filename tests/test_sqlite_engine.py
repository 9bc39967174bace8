"""SQLite connections of the site (memory/backends/wal.py): secure_delete on, WAL checkpoints off the commit path."""

import threading
import time

import pytest
from django.db import connection, transaction

from memory.backends.wal import WalCheckpointer
from memory.models import MemoryUser

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _sqlite_only():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite connections only; PostgreSQL checkpoints itself")


def pragma(name):
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA {name}")
        return cursor.fetchone()[0]


def test_every_connection_zeroes_what_it_deletes_and_leaves_checkpoints_to_the_thread():
    connection.ensure_connection()
    assert pragma("secure_delete") == 1
    assert pragma("journal_mode") == "wal"
    assert pragma("wal_autocheckpoint") == WalCheckpointer.BACKSTOP_PAGES


def test_commits_leave_wal_checkpoints_to_a_background_thread():
    """Writers only append to the WAL; the process's checkpointer copies it back into the database."""
    connection.ensure_connection()
    checkpointer = WalCheckpointer.for_file(connection.settings_dict["NAME"])
    before = checkpointer.checkpoints
    for i in range(50):
        with transaction.atomic():
            MemoryUser.objects.create(canonical_id=f"test:{i}")
    deadline = time.monotonic() + 10
    while checkpointer.checkpoints == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert checkpointer.checkpoints > before
    busy, wal_frames, copied = checkpointer.last_result
    assert wal_frames > 0 and copied > 0


def test_the_site_runs_on_djangos_own_sqlite_backend():
    assert connection.settings_dict["ENGINE"] == "django.db.backends.sqlite3"
    assert connection.settings_dict["OPTIONS"]["transaction_mode"] == "IMMEDIATE"


def test_a_new_connection_reads_while_another_connection_writes():
    """WAL lets readers go on beside a writer, and that must hold for a connection opened meanwhile:
    nothing a new connection runs first (the init command, the connection_created receivers) may wait
    for the write lock (PRAGMA auto_vacuum = ... did, and a fresh connection waited for every writer)."""
    MemoryUser.objects.create(canonical_id="test:ada")
    locked, release = threading.Event(), threading.Event()

    def write_slowly():
        try:
            with transaction.atomic():
                MemoryUser.objects.create(canonical_id="test:bob")
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    writer = threading.Thread(target=write_slowly)
    writer.start()
    try:
        assert locked.wait(10)
        connection.close()
        started = time.monotonic()
        assert list(MemoryUser.objects.values_list("canonical_id", flat=True)) == ["test:ada"]  # a new connection
        assert time.monotonic() - started < 5
    finally:
        release.set()
        writer.join(30)
    assert MemoryUser.objects.count() == 2
