"""The bundled model's document embeddings in a process of their own, at the lowest CPU priority.

Why a process and not the embedding worker's thread: the worker shares its interpreter with the
requests of its process, and every statement a request runs hands the interpreter over and has to
take it back. `python -m bench.facts` (SQLite, hybrid, 2 cores, one session): sets at about 1,500/s
with the model in the worker's thread, about 1,800/s with it here (about 1,930/s with no embedding
at all). At nice 19 the child takes only the CPU the rest leaves, so it may use a BLAS thread on
every core (the in-process model keeps to one, which would compete with requests) and embeds a
batch about a third faster. Its idle BLAS threads sleep at once instead of spinning: a spinning
thread, even at nice 19, delays every wake-up of the other processes, and on PostgreSQL each
statement is a round trip that wakes the client (sets 241/s with spinning threads, 373/s without).
The vectors are the same: the same code and weights (memory/local_model.py) run there.

The child reads lists of texts from its stdin and answers with their vectors on its stdout
(pickles, between this package's own two ends only). It imports no Django and opens no database;
it exits when its parent goes (its stdin closes). A child that fails to start, dies, or takes
longer than ANSWER_SECONDS (a machine whose CPU the requests take: at its lower priority it would
starve, and the vectors would never catch up) is logged and stopped, that batch is embedded in
this process, and so are the batches of the next RETRY_SECONDS; then a new child is tried.
"""

import logging
import os
import pickle
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

logger = logging.getLogger("engram.memory")

RETRY_SECONDS = 60.0
# A child at nice 19 gets little CPU when the requests take all of it: then its batches wait, and
# the vectors with them. Past this, the batch is embedded in this process (and for RETRY_SECONDS),
# where the worker thread shares the interpreter but keeps up. Per ANSWER_TEXTS texts (a worker's
# batch; the model embeds 64 short texts in about a quarter of a second on one core here).
ANSWER_SECONDS = 1.0
ANSWER_TEXTS = 64
STARTUP_SECONDS = 10.0  # more for a new child's first answer: it loads numpy and the weights first
NICE = 19  # the lowest


class ModelProcess:
    """A child process running MiniLM(folder).encode for this process (one call at a time)."""

    def __init__(self, folder):
        self._folder = str(folder)
        self._lock = threading.Lock()
        self._child = None
        self._pid = None
        self._failed_at = None

    @property
    def child_pid(self):
        """The child's process id, or None when none runs for this process."""
        child = self._child
        return child.pid if child is not None and self._pid == os.getpid() and child.poll() is None else None

    def encode(self, texts, fallback):
        """The vectors of `texts` from the child; from `fallback(texts)` in this process when it cannot."""
        with self._lock:
            if self._failed_at is not None and time.monotonic() - self._failed_at < RETRY_SECONDS:
                return fallback(texts)
            try:
                child, new = self._running()
                pickle.dump(list(texts), child.stdin, protocol=pickle.HIGHEST_PROTOCOL)
                child.stdin.flush()
                wait = ANSWER_SECONDS * max(1.0, len(texts) / ANSWER_TEXTS) + (STARTUP_SECONDS if new else 0.0)
                ready, _, _ = select.select([child.stdout], [], [], wait)
                if not ready:
                    raise TimeoutError(f"no answer within {wait:.0f} s: the machine is busy")
                status, payload = pickle.load(child.stdout)
            except (OSError, EOFError, pickle.UnpicklingError, ValueError) as exc:
                self._failed_at = time.monotonic()
                self._stop()
                logger.warning(
                    "the embedding process failed (%s); embedding in this process, retrying in %.0f s",
                    exc,
                    RETRY_SECONDS,
                )
                return fallback(texts)
            self._failed_at = None
        if status != "ok":  # the model itself refused these texts: as it would have in this process
            raise RuntimeError(f"the embedding process could not embed {len(texts)} texts: {payload}")
        return payload

    def _running(self):
        """(the child, whether it was started just now)."""
        if self._pid != os.getpid():  # a forked child: the pipes are its parent's to use
            self._child = None
        if self._child is not None and self._child.poll() is None:
            return self._child, False
        self._stop()
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
        # OpenBLAS's idle threads spin before they sleep; at nice 19 a spinning thread still delays
        # every wake-up of the other processes (a PostgreSQL round trip is one): sleep at once.
        env.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
        # The package this module is in, importable in the child whatever the parent's sys.path.
        here = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
        self._child = subprocess.Popen(
            [sys.executable, "-m", __name__, self._folder],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self._pid = os.getpid()
        return self._child, True

    def _stop(self):
        child, self._child = self._child, None
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


def model_process(folder):
    """The process-wide ModelProcess of these weights: an embedder built again (settings changed) reuses it."""
    key = str(folder)
    with _shared_lock:
        if key not in _shared:
            _shared[key] = ModelProcess(key)
        return _shared[key]


def serve(folder, source, sink):
    """The child's loop: a list of texts in, ("ok", vectors) or ("error", message) out, until EOF."""
    from .local_model import MiniLM

    model = MiniLM(Path(folder))
    while True:
        try:
            texts = pickle.load(source)
        except EOFError:
            return
        try:
            answer = ("ok", model.encode(texts))
        except Exception as exc:  # noqa: BLE001  (reported to the parent, which raises it there)
            answer = ("error", f"{type(exc).__name__}: {exc}")
        pickle.dump(answer, sink, protocol=pickle.HIGHEST_PROTOCOL)
        sink.flush()


def main(argv):
    try:
        os.setpriority(os.PRIO_PROCESS, 0, NICE)
    except (AttributeError, OSError):  # not Linux, or not allowed: run at the parent's priority
        pass
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but answers may reach the parent's pipe
    serve(argv[0], source, sink)


if __name__ == "__main__":
    main(sys.argv[1:])
