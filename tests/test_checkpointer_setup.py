"""The PostgreSQL checkpointer's tables are created by whichever server process needs them first."""

import threading

import pytest
from django.db import connection

from workflows.conversations.checkpointer import _postgres_saver

SAVER_TABLES = "checkpoints, checkpoint_blobs, checkpoint_writes, checkpoint_migrations"
PROCESSES = 4


def set_up_at_once():
    """PROCESSES savers set up at one barrier, each with its own pool (as server processes have);
    the exceptions they raised."""
    start = threading.Barrier(PROCESSES)
    failures, closers = [], []

    def set_up():
        start.wait()
        try:
            saver, close = _postgres_saver()
            closers.append(close)
            assert saver.get_tuple({"configurable": {"thread_id": "none", "checkpoint_ns": ""}}) is None
        except Exception as exc:  # noqa: BLE001  (collected: the caller's assertion names it)
            failures.append(exc)

    threads = [threading.Thread(target=set_up) for _ in range(PROCESSES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for close in closers:
        close()
    return failures


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_server_processes_setting_up_the_checkpointer_at_once_on_a_fresh_database_all_succeed():
    """Each server process sets the checkpointer up on its first workflow run; on a fresh database
    those runs come at once (the first updates after a deploy). A setup that failed answered its
    turn without the conversation's memory ("duplicate key value violates unique constraint")."""
    for _round in range(5):
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {SAVER_TABLES}")
        assert set_up_at_once() == []
