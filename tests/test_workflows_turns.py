"""One turn at a time per conversation thread, across the server's processes too.

A second process (a real one, with its own Django setup on the same database and checkpoint file)
holds a thread's turn lock; a turn of this process on that thread waits until it lets go, and a turn
on another thread does not wait. On SQLite the lock is a record lock beside the checkpoint file, on
PostgreSQL an advisory lock in the database; the same test runs on whichever is configured.
"""

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import database_url
from django.db import connection

from workflows.conversations.turns import one_turn_at_a_time

REPO = Path(__file__).resolve().parent.parent

HOLDER = """
import sys, django
django.setup()
from workflows.conversations.turns import one_turn_at_a_time
with one_turn_at_a_time(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
print("released", flush=True)
"""


@pytest.fixture
def other_process(_workflow_settings):
    """Starts a process that holds the turn lock of a thread until told to let go."""
    started = []

    def hold(thread_id):
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO)]),
            "DATABASE_URL": database_url(),
            "ENGRAM_DATA_DIR": str(Path(_workflow_settings["CHECKPOINT_PATH"]).parent),
        }
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, thread_id],
            env=env,
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        line = proc.stdout.readline().strip()
        assert line == "held", proc.stderr.read()
        return proc

    yield hold
    for proc in started:
        proc.kill()
        proc.wait()


def _turn_in_a_thread(thread_id):
    """Start a turn on `thread_id` in another thread; returns (acquired event, release event)."""
    acquired, release = threading.Event(), threading.Event()

    def turn():
        try:
            with one_turn_at_a_time(thread_id):
                acquired.set()
                release.wait(10)
        finally:
            connection.close()

    threading.Thread(target=turn, daemon=True).start()
    return acquired, release


@pytest.mark.django_db(transaction=True)
def test_a_turn_waits_for_another_process_holding_the_same_thread(other_process):
    holder = other_process("7:direct:1")

    waiting, release_waiting = _turn_in_a_thread("7:direct:1")
    other, release_other = _turn_in_a_thread("8:direct:1")
    assert other.wait(5), "a turn on another thread must not wait"
    release_other.set()
    assert not waiting.wait(0.5), "the turn went ahead while another process held its thread"

    holder.stdin.write("\n")
    holder.stdin.flush()
    assert holder.stdout.readline().strip() == "released"
    assert waiting.wait(5), "the turn did not go ahead once the other process let go"
    release_waiting.set()


@pytest.mark.django_db(transaction=True)
def test_a_process_that_dies_mid_turn_lets_the_next_turn_go(other_process):
    holder = other_process("9:direct:1")
    holder.kill()
    holder.wait()
    waiting, release = _turn_in_a_thread("9:direct:1")
    assert waiting.wait(5)
    release.set()
