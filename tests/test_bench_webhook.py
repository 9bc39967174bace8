"""bench.webhook runs end to end and prints exactly one JSON object with --json (no speed asserted here)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("server", ["wsgi", "asgi"])
def test_webhook_benchmark_prints_one_json_object(server):
    """Under gunicorn (WSGI) and uvicorn (ASGI) alike, every update is answered and its reply sent."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "DJANGO_SETTINGS_MODULE"}}
    done = subprocess.run(
        [sys.executable, "-m", "bench.webhook", "--updates", "20", "--users", "5", "--server", server, "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, done.stdout
    result = json.loads(lines[0])
    assert set(result) == {
        "updates",
        "mode",
        "server",
        "per_s",
        "p50_ms",
        "p95_ms",
        "cpu_ms",
        "model_cpu_ms",
        "errors",
        "vectors_pending",
        "server_log_chars",
        "errors_logged",
    }
    assert result["server_log_chars"] > 0  # gunicorn's start-up lines at least: the log was read back
    assert result["vectors_pending"] >= 0 and (result["mode"] == "hybrid" or result["vectors_pending"] == 0)
    assert result["server"] == server
    assert result["updates"] == 20 and result["errors"] == 0, done.stderr[-2000:]
    assert result["errors_logged"] == 0  # no turn went without its memory either
    assert result["per_s"] > 0 and 0 < result["p50_ms"] <= result["p95_ms"]
    # The server's processes did the work: CPU was read back; only hybrid runs model processes.
    assert result["cpu_ms"] > 0 and (result["mode"] == "hybrid" or result["model_cpu_ms"] == 0)


def test_crash_mode_loses_no_update_and_sends_each_reply_once():
    """A gunicorn worker SIGKILLed mid-load and the Bot API down for 3 s: every update has its finished
    run and its reply, with at most one duplicate reply for the killed process."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "DJANGO_SETTINGS_MODULE"}}
    command = [sys.executable, "-m", "bench.webhook", "--crash", "--updates", "40", "--users", "5"]
    command += ["--concurrency", "8", "--outage", "3", "--mode", "keyword", "--json"]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=500, check=True)
    (line,) = [line for line in done.stdout.splitlines() if line.strip()]
    result = json.loads(line)
    assert result["killed_processes"] == 1 and result["bot_api_down_s"] == 3
    assert result["lost_updates"] == 0, result
    assert result["runs_completed"] == result["updates"] == 40
    assert result["replies_sent"] - result["duplicate_replies"] == 40
    assert result["duplicate_replies"] <= result["killed_processes"]
    assert result["gave_up"] == 0 and result["replies_failed"] == 0
