"""The bundled model's document embeddings in a process of their own, at the lowest CPU priority.

Why a process and not the embedding worker's thread: the worker shares its interpreter with the
requests of its process, and every statement a request runs hands the interpreter over and has to
take it back, so a model in that thread slows every write (`python -m bench.facts` shows it). At
nice 19 the child takes only the CPU the rest leaves. It runs the model on one thread, as the
catch-up child below does: ONNX Runtime splits each product evenly between its threads and waits for
the last, so a second thread on a core the requests keep busy holds up the whole batch. The vectors are the same: the same code and weights
(memory/embedding/local_model.py) run there.

The child reads lists of texts from its stdin and answers with their vectors on its stdout
(pickles, between this package's own two ends only). It imports no Django and opens no database;
it exits when its parent goes (its stdin closes), and says "ready" once its weights are loaded.

At nice 19 the child gets only the CPU the requests leave, so on a machine they keep busy it falls
behind, and the vectors with it (vector recall would lag by minutes). So each batch has an
allowance: until its oldest write's due time (the embedding worker's batches: MEMORY["EMBED_DUE_MS"]
after that write committed, see vectors_due), else ANSWER_SECONDS or twice what one busy core needs
for its characters. A batch the child has not answered by then is late, and goes to a second
child, the catch-up child, which runs at the parent's priority with one thread (started the
first time a batch is late, and waited for while it loads its weights): the vectors take their
share of the CPU now. Not the worker's own thread: there the model would hold the interpreter the
requests of the process need (bench.webhook slows to a crawl with late batches embedded in the
worker's thread).
The background child finishes a late batch in the CPU left over; its late answer is read and
dropped before it is sent another, and until then, as while it loads its weights, batches go
straight to the catch-up child. A child that fails to start, dies or answers garbage is logged and
stopped, and its batches are embedded by the next in line (the catch-up child, then this process)
for RETRY_SECONDS; then a new child is tried.
"""

import contextvars
import ctypes
import logging
import os
import pickle
import select
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger("engram.memory")

RETRY_SECONDS = 60.0
# A batch's allowance in the background child: a quarter of a second (a fraction of the one second
# in which vector recall should find a write), or twice what one busy core here needs for its text
# (the model reads about 3,000 characters a second on one core of this 2-core machine, short texts or
# 96-word pieces alike), so that a long sweep batch is not taken from an idle child.
ANSWER_SECONDS = 0.25
ANSWER_CHARS_PER_SECOND = 1500
NICE = 19  # the background child's: the lowest
# The catch-up child's allowance: it runs at the requests' priority; only a hung one misses it.
CATCH_UP_SECONDS = 30.0
READY = ("ready", None)  # the child's first message: its weights are loaded
# A child idle this long hands the memory its batches' activations took back to the system.
IDLE_SECONDS = 2.0
_due = contextvars.ContextVar("engram_vectors_due", default=None)


@contextmanager
def vectors_due(at):
    """Within this block, a batch is late at time.monotonic() `at` (its oldest write's due time):
    the background child gets only until then, and a batch already late goes straight to the
    catch-up child."""
    token = _due.set(at)
    try:
        yield
    finally:
        _due.reset(token)


class ModelProcess:
    """A child process running MiniLM(folder).encode for this process (one call at a time): in the
    background (nice 19, a short allowance) or to catch up (the parent's priority, a long one)."""

    def __init__(self, folder, catch_up=False):
        self._folder = str(folder)
        self.catch_up = catch_up
        self._lock = threading.Lock()
        self._child = None
        self._pid = None
        self._failed_at = None
        self._owed = 0  # messages the child will still send: its "ready", answers of batches it was too slow for
        self._loading = False  # it has not said "ready" yet

    @property
    def child_pid(self):
        """The child's process id, or None when none runs for this process."""
        child = self._child
        return child.pid if child is not None and self._pid == os.getpid() and child.poll() is None else None

    def start(self, timeout):
        """Start the child if none runs and wait up to `timeout` s until it owes nothing; whether it does not."""
        with self._lock:
            try:
                return self._caught_up(self._running(), timeout)
            except (OSError, EOFError, pickle.UnpicklingError, ValueError) as exc:
                self._failed(exc)
                return False

    def encode(self, texts, fallback):
        """The vectors of `texts` from the child; from `fallback(texts)` in this process when it cannot."""
        texts = list(texts)
        with self._lock:
            if self._failed_at is not None and time.monotonic() - self._failed_at < RETRY_SECONDS:
                return fallback(texts)
            try:
                child = self._running()
                allowance = max(
                    CATCH_UP_SECONDS if self.catch_up else ANSWER_SECONDS,
                    2.0 * sum(map(len, texts)) / ANSWER_CHARS_PER_SECOND,
                )
                due = None if self.catch_up else _due.get()
                if due is not None:  # the writes' own deadline, however long the batch
                    allowance = due - time.monotonic()
                # The catch-up child loading its weights is waited for: embedding here instead would
                # take the CPU and the interpreter of the requests in this process (bench.facts shows
                # a burst of sets slowing when it does).
                wait = allowance if self.catch_up and self._loading else 0.0
                # Loading its weights, still on a batch it was late with, or the batch is late already.
                if allowance <= 0 or not self._caught_up(child, wait):
                    return fallback(texts)
                pickle.dump(texts, child.stdin, protocol=pickle.HIGHEST_PROTOCOL)
                child.stdin.flush()
                ready, _, _ = select.select([child.stdout], [], [], allowance)
                if not ready:  # the machine is busy: the child finishes in what the CPU leaves, unread
                    self._owed += 1
                    logger.debug("the embedding process is behind; %d texts embedded elsewhere", len(texts))
                    return fallback(texts)
                status, payload = pickle.load(child.stdout)
            except (OSError, EOFError, pickle.UnpicklingError, ValueError) as exc:
                self._failed(exc)
                return fallback(texts)
            self._failed_at = None
        if status != "ok":  # the model itself refused these texts: as it would have in this process
            raise RuntimeError(f"the embedding process could not embed {len(texts)} texts: {payload}")
        return payload

    def _caught_up(self, child, timeout):
        """Read and drop what the child still owes, waiting up to `timeout` s; whether it owes nothing now."""
        deadline = time.monotonic() + timeout
        while self._owed:
            ready, _, _ = select.select([child.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return False
            pickle.load(child.stdout)
            self._owed, self._loading = self._owed - 1, False
        return True

    def _failed(self, exc):
        self._failed_at = time.monotonic()
        self._stop()
        logger.warning(
            "the embedding process failed (%s); embedding in this process, retrying in %.0f s", exc, RETRY_SECONDS
        )

    def _running(self):
        """The child, started now if none runs for this process."""
        if self._pid != os.getpid():  # a forked child: the pipes are its parent's to use
            self._child = None
        if self._child is not None:
            code = self._child.poll()
            if code is None:
                return self._child
            if self._loading:  # it never loaded the model: starting it again would not either
                raise ChildProcessError(f"it exited with code {code} before it was ready")
            logger.warning("the embedding process exited with code %s; starting a new one", code)
        self._stop()
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
        # The package this module is in, importable in the child whatever the parent's sys.path.
        here = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
        self._child = subprocess.Popen(
            [sys.executable, "-m", __name__, self._folder] + ([] if self.catch_up else ["--background"]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self._pid = os.getpid()
        self._owed, self._loading = 1, True  # it owes its "ready"
        return self._child

    def _stop(self):
        child, self._child = self._child, None
        self._owed = 0
        if child is None or self._pid != os.getpid():
            return
        try:
            child.kill()
            child.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for pipe in (child.stdin, child.stdout):
            try:
                pipe.close()
            except OSError:
                pass

    def close(self):
        with self._lock:
            self._stop()


_shared = {}
_shared_lock = threading.Lock()


def model_process(folder, catch_up=False):
    """The process-wide ModelProcess of these weights: an embedder built again (settings changed) reuses it."""
    key = (str(folder), catch_up)
    with _shared_lock:
        if key not in _shared:
            _shared[key] = ModelProcess(key[0], catch_up=catch_up)
        return _shared[key]


def serve(folder, source, sink):
    """The child's loop: "ready", then a list of texts in, ("ok", vectors) or ("error", message) out, until EOF."""
    from .local_model import MiniLM

    def send(message):
        try:
            pickle.dump(message, sink, protocol=pickle.HIGHEST_PROTOCOL)
            sink.flush()
            return True
        except BrokenPipeError:  # the parent went meanwhile (a late answer it no longer reads)
            return False

    model = MiniLM(Path(folder))  # one thread: see the module's docstring
    ready = send(READY)
    while ready:
        # The parent sends a batch only once it has read the answer before (or given up on it and
        # read it later), so nothing of the next one is buffered here while the pipe is empty.
        if not select.select([source], [], [], IDLE_SECONDS)[0]:
            release_freed_memory()
        try:
            texts = pickle.load(source)
        except EOFError:
            return
        try:
            answer = ("ok", model.encode(texts))
        except Exception as exc:  # noqa: BLE001  (reported to the parent, which raises it there)
            answer = ("error", f"{type(exc).__name__}: {exc}")
        ready = send(answer)


def release_freed_memory():
    """Return the C heap's free pages to the system (glibc's malloc_trim; elsewhere nothing).

    ONNX Runtime allocates each batch's activations afresh (its memory arena is off) and glibc keeps
    what they freed: without this, a child that once embedded a batch of long pieces would stay at
    that batch's size for good (bench.embedder prints the resident memory before and after).
    """
    try:
        ctypes.CDLL(None).malloc_trim(0)  # the process's own symbols: the C library it runs on
    except (OSError, AttributeError):  # not glibc (no malloc_trim), or no symbols to look in
        pass


def resident_bytes():
    """This process's resident memory (RSS) in bytes, from Linux's /proc; None elsewhere."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def main(argv):
    if "--background" in argv:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, NICE)
        except (AttributeError, OSError):  # not Linux, or not allowed: run at the parent's priority
            pass
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but answers may reach the parent's pipe
    serve(argv[0], source, sink)


if __name__ == "__main__":
    main(sys.argv[1:])
