"""Counting strings in the raw bytes of SQLite files without dropping this process's SQLite locks.

SQLite's locks are POSIX advisory locks, which belong to a process and a file: closing *any*
descriptor of the database file drops every lock the process holds on it, those of its open SQLite
connections included (sqlite.org/howtocorrupt.html, section 2.2). Another process that closes its
last connection then takes itself for the file's only user, checkpoints and deletes the WAL under
our connections, and the next connection here fails with "disk I/O error". So the files are read by
a child process, whose descriptors are its own: this module runs as that child too (stdlib only).
"""

import json
import subprocess
import sys


def count_in_files(paths, needles):
    """{path: {needle: occurrences}} of each needle (case-insensitive) in each existing file's bytes."""
    request = json.dumps({"paths": [str(p) for p in paths], "needles": list(needles)})
    # -I: isolated, so the child imports nothing of the site or the environment it does not need.
    child = subprocess.run(
        [sys.executable, "-I", __file__], input=request, capture_output=True, text=True, check=False, timeout=600
    )
    if child.returncode != 0:
        raise RuntimeError(f"reading the database files failed: {child.stderr.strip()[-500:]}")
    return json.loads(child.stdout)


def _count(request):
    counts = {}
    for path in request["paths"]:
        try:
            with open(path, "rb") as file:
                data = file.read().lower()
        except FileNotFoundError:
            continue
        counts[path] = {needle: data.count(needle.lower().encode("utf-8")) for needle in request["needles"]}
    return counts


if __name__ == "__main__":
    json.dump(_count(json.load(sys.stdin)), sys.stdout)
