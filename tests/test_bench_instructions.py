"""bench.instructions runs under callgrind and prints one JSON object (no instruction count asserted here)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")),
    reason="the benchmark runs on SQLite whatever the suite's database: once is enough",
)
@pytest.mark.skipif(
    not (shutil.which("valgrind") and shutil.which("cc") and Path("/usr/include/valgrind/callgrind.h").exists()),
    reason="needs valgrind, its header and a C compiler",
)
def test_instructions_benchmark_counts_both_sides():
    """A tiny run against HEAD: every fact operation is counted at both sides, with a ratio."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "DJANGO_SETTINGS_MODULE"}}
    command = [sys.executable, "-m", "bench.instructions", "--against", "HEAD", "--groups", "facts"]
    command += ["--modes", "keyword", "--n", "1000", "--calls", "3", "--json"]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=True)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, done.stdout
    result = json.loads(lines[0])
    counted = {row["operation"]: row for row in result["operations"]}
    assert set(counted) == {"get_fact", "set_fact", "search_facts"}, done.stderr[-2000:]
    for row in counted.values():
        assert row["old"] > 10_000 and row["new"] > 10_000 and row["new_over_old"] > 0
