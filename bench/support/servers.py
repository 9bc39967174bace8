"""Servers on loopback for the benchmarks: gunicorn or uvicorn over a scratch site, and waiting for them."""

import collections
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .scratch import REPO

TOKEN = "bench:token"
SECRET = "bench-secret"
WARMUP = 8  # per server worker
THREADS_PER_WORKER = 4


def text_for(n, user):
    if (n // 50) % 2 == 0:
        return f"my favourite number is {n * 7 + user}"
    return "what is my favourite number?"


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port, workers, kind="wsgi"):
    """The site under gunicorn (WSGI) or uvicorn (ASGI) in child processes with this process's environment."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO)])}
    if kind == "asgi":
        command = ["uvicorn", "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
        command += ["--log-level", "warning", "config.asgi:application"]
    else:
        command = ["gunicorn", "--workers", str(workers), "--threads", str(THREADS_PER_WORKER)]
        command += ["--bind", f"127.0.0.1:{port}", "config.wsgi:application"]
    # Its log goes to a file, not a pipe: nothing reads a pipe during the run, and a server that
    # fills one (64 KB) blocks in its next write to it, in the middle of a request.
    log = tempfile.TemporaryFile("w+")
    server = subprocess.Popen(
        [sys.executable, "-m", *command], env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log, text=True
    )
    server.log = log
    return server


def server_log(server, tail=2000):
    """The last `tail` characters the server wrote to its stderr."""
    server.log.seek(0)
    text = server.log.read()
    return text if tail is None else text[-tail:]


def wait_until_serving(server, port, timeout=60):
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited: {server_log(server)}")
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
            return
        except httpx.TransportError:
            time.sleep(0.2)
    raise RuntimeError("the server did not start within a minute")


def process_tree(pid):
    """A process and its descendants (Linux /proc)."""
    children = collections.defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                children[int(fields[1])].append(int(entry.name))
            except (OSError, IndexError):
                continue
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def cpu_seconds(pid):
    """{process id: (is a model process, CPU seconds so far)} of a process and its descendants.

    The model processes (memory/embedding/model_process.py) are told apart by their command line, so
    that what embedding documents costs shows beside what the requests cost.
    """
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for current in process_tree(pid):
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            command = Path(f"/proc/{current}/cmdline").read_bytes()
        except OSError:
            continue
        # utime and stime: fields 14 and 15 of stat, 12 and 13 after the command's closing parenthesis.
        found[current] = (b"model_process" in command, (int(fields[11]) + int(fields[12])) / tick)
    return found


def cpu_between(before, after):
    """(all CPU seconds, the model processes' share) spent between two cpu_seconds() readings; a
    process started in between counts from zero."""
    spent = model = 0.0
    for pid, (is_model, seconds) in after.items():
        used = seconds - before.get(pid, (is_model, 0.0))[1]
        spent += used
        model += used if is_model else 0.0
    return spent, model
