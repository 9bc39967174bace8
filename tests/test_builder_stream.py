"""Streamed runs through real servers: gunicorn (WSGI, threads), uvicorn (ASGI) and Django's live test
server, read incrementally with httpx. Each event must arrive when the graph produces it: the agent's
chat model (LangChain's fake, tests/slow_chat.py) takes a second, and the events before it must be
in the client's hands while it thinks, not delivered with the end of the run.

The site runs on a scratch database of the suite's kind (a SQLite file, or a throw-away PostgreSQL
database beside the test one), like test_hostile_input.py.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from django.db import connection

from tests.scratch_site import free_port, scratch_site

REPO = Path(__file__).resolve().parent.parent
MODEL_SECONDS = 1.0  # tests/slow_chat.py

SETUP = """
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from workflows.demo import ensure_demo_workflow
staff = get_user_model().objects.create_user("stream-operator", is_staff=True)
ensure_demo_workflow()
print(Token.objects.create(user=staff).key)
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory, django_db_blocker):
    """(environment, staff token) of a migrated scratch database with the demo workflow."""
    with django_db_blocker.unblock():
        vendor, settings_dict = connection.vendor, dict(connection.settings_dict)
    data = tmp_path_factory.mktemp("stream")
    env = {
        **{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        "DJANGO_SETTINGS_MODULE": "tests.builder_site_settings",
        "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO)]),
        "ENGRAM_DATA_DIR": str(data),
        "ENGRAM_EMBEDDINGS": "none",
    }
    with scratch_site("stream", vendor=vendor, settings_dict=settings_dict, data=data, env=env, setup=SETUP) as token:
        yield env, token


SERVERS = {
    "gunicorn": lambda port: (
        ["gunicorn", "--workers", "1", "--threads", "2", "--bind", f"127.0.0.1:{port}"] + ["config.wsgi:application"]
    ),
    "uvicorn": lambda port: (
        ["uvicorn", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"] + ["config.asgi:application"]
    ),
}


@pytest.fixture(params=sorted(SERVERS))
def server(request, site, tmp_path):
    """(base url, staff token) of the site under gunicorn or uvicorn, stopped afterwards."""
    env, token = site
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", *SERVERS[request.param](port)],
            env=env,
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/healthz", timeout=2)
                break
            except httpx.HTTPError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not start: {log.read_text()[-3000:]}") from None
                time.sleep(0.2)
        yield url, token
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def read_stream(url, headers, body, slug="demo"):
    """[(seconds since the request, event type, data)] as the events arrive."""
    events = []
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        sent = time.monotonic()
        with client.stream("POST", f"/api/v1/workflows/{slug}/runs/stream/", json=body) as response:
            assert response.status_code == 200, response.read()
            assert response.headers["content-type"].startswith("text/event-stream")
            assert response.headers["cache-control"] == "no-cache"
            assert "content-length" not in response.headers
            block = {}
            for line in response.iter_lines():
                if line:
                    name, _, value = line.partition(": ")
                    block[name] = value
                    continue
                if block:
                    events.append((time.monotonic() - sent, block["event"], json.loads(block["data"])))
                    block = {}
    return events


def check_streamed(events):
    kinds = [kind for _, kind, _ in events]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    assert [d["node"] for _, k, d in events if k == "node_finished"] == ["identify_user", "recall", "agent", "remember"]
    arrived = {(kind, data.get("node")): at for at, kind, data in events}
    # The events before the agent were in hand while the model thought: not held back to the end.
    waited = arrived[("run_finished", None)] - arrived[("node_started", "agent")]
    assert waited >= MODEL_SECONDS * 0.8, events
    assert arrived[("run_finished", None)] - arrived[("run_started", None)] >= MODEL_SECONDS * 0.8
    agent = next(d for _, k, d in events if k == "node_finished" and d["node"] == "agent")
    assert agent["duration_ms"] >= MODEL_SECONDS * 1000 * 0.8
    end = events[-1][2]
    assert end["status"] == "succeeded" and end["reply"] == "Hello from the slow model."
    return end


@pytest.mark.django_db
def test_runs_stream_event_by_event_under_gunicorn_and_uvicorn(server):
    url, token = server
    headers = {"Authorization": f"Token {token}", "Accept": "text/event-stream"}
    body = {"message": "my name is Ada", "channel": "telegram", "external_id": 42, "display_name": "Ada"}
    end = check_streamed(read_stream(url, headers, body))
    with httpx.Client(base_url=url, headers={"Authorization": f"Token {token}"}, timeout=30) as client:
        run = client.get(f"/api/v1/runs/{end['run_id']}/").json()
        assert run["status"] == "succeeded" and run["events"][-1]["data"] == end
        assert run["user"] is not None and run["channel"] == "telegram" and run["external_id"] == "42"
        refused = client.post("/api/v1/workflows/demo/runs/stream/", json={"message": "hi"})
        assert refused.status_code == 400 and "channel" in refused.json()


@pytest.mark.django_db(transaction=True)
def test_runs_stream_under_djangos_live_server(live_server, settings, staff):
    from rest_framework.authtoken.models import Token

    from workflows.demo import ensure_demo_workflow

    settings.WORKFLOWS = {**settings.WORKFLOWS, "CHAT_MODEL": {"class": "tests.slow_chat.SlowChat"}}
    ensure_demo_workflow()
    headers = {"Authorization": f"Token {Token.objects.create(user=staff).key}", "Accept": "text/event-stream"}
    body = {"message": "hello", "channel": "chat", "external_id": "ada"}
    check_streamed(read_stream(live_server.url, headers, body))
