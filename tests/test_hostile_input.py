"""Hostile input against a live server: every answer below 500, every refusal naming what was wrong.

The site runs under gunicorn (2 workers x 2 threads) in child processes, on a scratch database of the
suite's kind (a SQLite file, or a throw-away PostgreSQL database beside the test one), with a staff
token, the demo workflow and a Telegram webhook secret. The inputs are the ones an attacker sent to
an earlier version (each answered 500 then) and their kin. The server's log is read at the end: no
traceback may be in it.
"""

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from django.db import connection

from tests.scratch_site import free_port, scratch_site

REPO = Path(__file__).resolve().parent.parent
SECRET = "hostile-secret"
DEEP = "[" * 5000 + "]" * 5000
WORDS_1000 = " ".join(["ab"] * 1000)  # short words: the URL stays under gunicorn's default request-line limit
# The gunicorn settings scripts/serve.sh serves with.
GUNICORN_CONF = REPO / "platform" / "gunicorn.conf.py"

SETUP = """
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from memory.service import MemoryService
from workflows.demo import ensure_demo_workflow
staff = get_user_model().objects.create_user("hostile-operator", is_staff=True)
memory = MemoryService()
ada, _ = memory.get_or_create_user("telegram", 7, display_name="Ada")
memory.set_fact("favourite_colour", "blue", scope="user", user_id=ada.pk, fact_type="user_preference")
episode = memory.start_episode(agent_id="demo", user_id=ada.pk)
memory.complete_episode(episode.pk, success=True, summary="a chat")
memory.save_procedure("weather", description="ask for the city")
ensure_demo_workflow()
print(Token.objects.create(user=staff).key)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory, django_db_blocker):
    """(base url, staff token, log file) of a gunicorn server on a scratch database, stopped afterwards."""
    with django_db_blocker.unblock():
        vendor, settings_dict = connection.vendor, dict(connection.settings_dict)
    data = tmp_path_factory.mktemp("hostile")
    env = {
        **{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO)]),
        "ENGRAM_DATA_DIR": str(data),
        "ENGRAM_EMBEDDINGS": "none",
        "TELEGRAM_WEBHOOK_SECRET": SECRET,
        "TELEGRAM_BOT_TOKEN": "1:hostile",
        "TELEGRAM_API_BASE": "http://127.0.0.1:9",  # replies go nowhere: sending fails, and says so
    }
    with scratch_site("hostile", vendor=vendor, settings_dict=settings_dict, data=data, env=env, setup=SETUP) as token:
        with _serving(env, data) as (url, log):
            yield url, token, log


@contextmanager
def _serving(env, data):
    """(base url, log file) of gunicorn serving the scratch site, stopped afterwards."""
    port = free_port()
    log = data / "server.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "--config",
                str(GUNICORN_CONF),
                "--workers",
                "2",
                "--threads",
                "2",
                "--bind",
                f"127.0.0.1:{port}",
                "config.wsgi:application",
            ],
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
        yield url, log
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def api(server):
    url, token, _ = server
    with httpx.Client(base_url=url, headers={"Authorization": f"Token {token}"}, timeout=60) as client:
        yield client


def raw_json(client, path, text, headers=None):
    """POST a JSON text exactly as written (escapes such as \\ud800 reach the server as they are)."""
    return client.post(path, content=text.encode(), headers={"Content-Type": "application/json", **(headers or {})})


def refused(response, field=None):
    """A 4xx JSON answer (naming `field` when given); never a 5xx, never an HTML page."""
    assert response.status_code < 500, (response.status_code, response.text[:500])
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
    body = response.json()
    if field is not None:
        assert field in json.dumps(body), body
    return body


LIST_QUERIES = [
    ("/api/v1/facts/", {"page_size": "²"}, "page_size"),
    ("/api/v1/facts/", {"page": "٣"}, "page"),
    ("/api/v1/facts/", {"fact_type": ""}, "fact_type"),
    ("/api/v1/facts/", {"user": ""}, "user"),
    ("/api/v1/episodes/", {"success": ""}, "success"),
    ("/api/v1/facts/", {"ordering": "secret_column"}, "ordering"),
    ("/api/v1/facts/", {"colour": "blue"}, "colour"),
    ("/api/v1/facts/", {"user": str(2**70)}, "user"),
    ("/api/v1/facts/", {"search": "a\x00b"}, "search"),
    ("/api/v1/facts/", {"search": WORDS_1000}, "search"),
    ("/api/v1/episodes/", {"search": WORDS_1000}, "search"),
    ("/api/v1/memory-users/", {"search": WORDS_1000}, "search"),
    ("/api/v1/procedures/", {"search": WORDS_1000}, "search"),
    ("/api/v1/recall/", {"q": "name", "user_id": "1"}, "user_id"),
    ("/api/v1/recall/", {"q": WORDS_1000[:2990] + "\x00"}, "q"),
    ("/api/v1/checkpoints/", {"bogus": "1"}, "bogus"),
]


@pytest.mark.parametrize("path, params, field", LIST_QUERIES)
def test_hostile_query_parameters_are_refused_naming_them(api, path, params, field):
    refused(api.get(path, params=params), field)


def test_a_long_recall_query_is_served(api):
    response = api.get("/api/v1/recall/", params={"q": WORDS_1000[:2990], "user": "1"})
    assert response.status_code == 200, response.text[:500]


def test_serve_sh_serves_with_the_gunicorn_settings_used_here():
    assert "--config platform/gunicorn.conf.py" in (REPO / "scripts" / "serve.sh").read_text()


@pytest.mark.parametrize(
    "path", ["/api/v1/facts/", "/api/v1/episodes/", "/api/v1/memory-users/", "/api/v1/procedures/"]
)
def test_a_search_of_1000_words_is_a_json_400_naming_search_and_its_limit(api, path):
    words = " ".join(["abcd"] * 1000)  # a request line of 5 to 7 KB: past gunicorn's default 4094 bytes
    response = api.get(path, params={"search": words})
    assert response.status_code == 400 and response.headers["content-type"].startswith("application/json")
    assert response.json() == {"search": ["must be at most 1000 characters"]}


def test_a_recall_query_over_its_limit_is_a_json_400_naming_q_and_its_limit(api):
    response = api.get("/api/v1/recall/", params={"q": " ".join(["abcd"] * 900), "user": "1"})
    assert response.status_code == 400 and response.headers["content-type"].startswith("application/json")
    assert response.json() == {"q": ["Ensure this field has no more than 4000 characters."]}


def test_a_request_line_past_the_documented_size_is_refused_by_gunicorn(api):
    """8190 bytes, gunicorn's maximum (platform/gunicorn.conf.py; the README says so): past it, gunicorn's own 414."""
    assert api.get("/api/v1/facts/", params={"search": "a" * 8200}).status_code == 414


BODIES = [
    ("/api/v1/facts/batch-delete/", DEEP, None),
    ("/api/v1/memory-users/batch-delete/", DEEP, None),
    ("/api/v1/facts/batch-delete/", '{"ids": ["\\ud800"]}', "ids"),
    ("/api/v1/facts/batch-delete/", f'{{"ids": [{2**70}]}}', "ids"),
    ("/api/v1/facts/batch-delete/", '{"ids": [1], "extra": "\\u0000"}', "extra"),
    ("/api/v1/workflows/demo/run/", DEEP, None),
    ("/api/v1/workflows/demo/run/", '{"user_id": "mallory", "message": "hi \\ud800"}', "message"),
    ("/api/v1/workflows/demo/run/", '{"user_id": "mallory", "message": "a\\u0000b"}', "message"),
    ("/api/v1/workflows/demo/run/", '{"user_id": "mallory"}', "message"),
    ("/api/v1/workflows/demo/run/", '{"user_id": "mallory", "message": ""}', "message"),
    ("/api/v1/workflows/demo/run/", f'{{"user_id": {2**70}, "message": "hi"}}', "user_id"),
    ("/api/v1/workflows/demo/run/", '{"user_id": "mallory", "message": "hi", "meta": {"n": 1e999}}', None),
    ("/api/v1/workflows/de.mo/run/", '{"user_id": "mallory", "message": "hi"}', "path"),
]


@pytest.mark.parametrize("path, text, field", BODIES)
def test_hostile_bodies_are_refused_and_change_nothing(api, path, text, field):
    before = api.get("/api/v1/memory-users/").json()["count"]
    refused(raw_json(api, path, text), field)
    assert api.get("/api/v1/memory-users/").json()["count"] == before  # nobody was created


def test_a_body_over_the_upload_limit_is_a_json_413(api):
    response = raw_json(api, "/api/v1/facts/batch-delete/", '{"ids": [' + "1," * 1_400_000 + "1]}")
    assert response.status_code == 413 and response.headers["content-type"].startswith("application/json")


def telegram(text=None, **parts):
    update = {
        "update_id": 900,
        "message": {
            "message_id": 1,
            "from": {"id": 501, "first_name": "Eve"},
            "chat": {"id": 501, "type": "private"},
            "text": text or "hello",
        },
    }
    update.update(parts)
    return update


WEBHOOK = [
    DEEP,
    json.dumps(telegram(update_id=2**70)),
    json.dumps(
        {"update_id": 903, "callback_query": {"id": "c", "from": {"id": 501}, "data": "x", "message": "not a message"}}
    ),
    json.dumps(
        {"update_id": 901, "message": {"from": {"id": 501}, "chat": {"id": 501, "type": ["private"]}, "text": "hi"}}
    ),
    json.dumps(telegram()).replace('"hello"', '"hi \\ud800"'),
    json.dumps(telegram()).replace('"hello"', '"a\\u0000b"'),
    json.dumps(
        {"update_id": 902, "message": {"from": {"id": 501, "first_name": {"x": 1}}, "chat": "501", "text": "hi"}}
    ),
    "not json at all",
]


@pytest.mark.parametrize("text", WEBHOOK)
def test_hostile_telegram_updates_are_acknowledged_as_rejected(server, text):
    url, _, _ = server
    response = httpx.post(
        f"{url}/telegram/demo/webhook/",
        content=text.encode(),
        headers={"X-Telegram-Bot-Api-Secret-Token": SECRET, "Content-Type": "application/json"},
    )
    assert response.status_code == 200, response.text[:500]  # acknowledged: Telegram must not retry it forever
    assert response.json()["status"] == "rejected" and response.json()["errors"]


def test_unknown_webhook_slug_is_a_json_404(server):
    url, _, _ = server
    response = httpx.post(
        f"{url}/telegram/no.such/webhook/", json=telegram(), headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}
    )
    assert response.status_code == 404 and response.headers["content-type"].startswith("application/json")


def test_the_server_logged_no_traceback(server, api):
    """Runs last in this module: whatever the inputs above did, none ended in an unhandled exception."""
    _, _, log = server
    assert api.get("/healthz").json()["unhandled_errors"] == 0
    assert "Traceback" not in log.read_text()
