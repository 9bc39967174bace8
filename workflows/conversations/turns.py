"""One turn at a time per conversation thread, in this process and across the server's processes.

Two quick messages of one person must not both continue from the same checkpoint: the later turn
would save a history without the earlier one. A turn holds its thread's lock from loading the
history to saving the new checkpoint. Threads of one process wait on an in-process lock per thread
id; processes (several server workers) wait on a lock in the checkpointer's own store:

- SQLite checkpoints: a POSIX record lock (`fcntl.lockf`) on one byte, chosen by the thread id,
  of a file beside the checkpoint file. Record locks belong to a process, so the in-process lock is
  taken first; the operating system releases them when a process dies.
- PostgreSQL checkpoints: a session advisory lock (`pg_advisory_lock`) on the thread's database
  connection, keyed by the thread id. Needs session pooling (not PgBouncer's transaction mode).

Neither lock has a timeout, like the in-process one: a turn ends (a model call has its own timeout)
or its process dies.
"""

import fcntl
import hashlib
import logging
import os
import threading
import weakref
from contextlib import contextmanager

from django.db import DatabaseError, connection

from .checkpointer import checkpoint_path, checkpointer_kind

logger = logging.getLogger("engram.workflows")


def lock_key(thread_id):
    """A thread id as a signed 64-bit number (PostgreSQL advisory lock keys are bigint)."""
    return int.from_bytes(hashlib.blake2b(thread_id.encode(), digest_size=8).digest(), "big", signed=True)


class _InProcess:
    __slots__ = ("lock", "__weakref__")

    def __init__(self):
        self.lock = threading.Lock()


_registry_lock = threading.Lock()
_in_process = weakref.WeakValueDictionary()
_lock_files = {}


@contextmanager
def _process_lock(thread_id):
    with _registry_lock:
        holder = _in_process.get(thread_id)
        if holder is None:
            holder = _in_process[thread_id] = _InProcess()
    with holder.lock:
        yield


def _lock_file(path):
    """This process's descriptor of the lock file, opened once and never closed: closing any
    descriptor of a file drops every record lock the process holds on it."""
    key = (os.getpid(), str(path))  # a forked worker opens its own
    with _registry_lock:
        fd = _lock_files.get(key)
        if fd is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = _lock_files[key] = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        return fd


@contextmanager
def _file_lock(thread_id):
    path = checkpoint_path()
    fd = _lock_file(path.with_name(path.name + ".turns"))
    offset = lock_key(thread_id) & (2**62 - 1)
    fcntl.lockf(fd, fcntl.LOCK_EX, 1, offset)  # waits without holding the GIL
    try:
        yield
    finally:
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, offset)


@contextmanager
def _advisory_lock(thread_id):
    key = lock_key(thread_id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [key])
    try:
        yield
    finally:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
        except DatabaseError as exc:  # the session is gone, and its locks with it
            logger.warning("could not release the turn lock of thread %s: %s", thread_id, exc)


@contextmanager
def one_turn_at_a_time(thread_id):
    """Hold while a turn runs on `thread_id` (see the module's docstring)."""
    across = _advisory_lock if checkpointer_kind() == "postgres" else _file_lock
    with _process_lock(thread_id), across(thread_id):
        yield
