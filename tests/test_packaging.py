"""Engram as a library: the wheel holds the two apps with their templates and static files (and no
`config` package), and a project made by `django-admin startproject` runs Engram after the steps the
guide docs/guides/django-project.md gives ("Add Engram to an existing Django project").

The sdist is built from the checkout and the wheel from the sdist (`python -m build`), as a release
is, so a file missing from either fails here. The build runs without isolation, on the setuptools and
build of the `dev` extra, so it needs no network and always runs. The host gets a fresh virtualenv
with the wheel installed into it; its other dependencies come from this test's environment (a path
entry), so nothing is downloaded and Engram's checkout is not on its path.
"""

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

REPO = Path(__file__).resolve().parent.parent
BUILDER_BUILD = "workflows/static/workflows/builder"

GUIDE = REPO / "docs" / "guides" / "django-project.md"


def readme_block(marker):
    """The code block after `<!-- host-project:<marker> -->` in the guide: what a host project adds."""
    after = GUIDE.read_text().split(f"<!-- host-project:{marker} -->\n", 1)[1]
    return re.match(r"```[\w.]*\n(.*?)```", after, re.S).group(1)


# Run inside the host project after the guide's commands (its own process, as a script would).
HOST_SCRIPT = """
import django, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
django.setup()
from django.test.utils import setup_test_environment
setup_test_environment()  # the test client's host, "testserver", allowed
import memory
from django.contrib.auth import get_user_model
from django.contrib.staticfiles import finders
from django.test import Client
from memory.service import MemoryService

assert "site-packages" in memory.__file__, memory.__file__
assert "site-packages" in finders.find("memories/memories.css")
service = MemoryService()
user, _ = service.get_or_create_user("chat", "ada")
service.set_fact("drink", "green tea", scope="user", user_id=user.pk)
hits = service.recall("what does she drink", user_id=user.pk)
assert [h.item.value for h in hits][:1] == ["green tea"], hits
client = Client()
assert client.get("/healthz").status_code == 200
assert client.get("/memories/").status_code == 302  # to the login page
client.force_login(get_user_model().objects.get(username="op"))  # made by createsuperuser
page = client.get("/memories/", follow=True)  # to the first tab
assert page.status_code == 200 and b"memories-tabs" in page.content, page.status_code
assert client.get("/api/v1/facts/").json()["count"] == 1
# The demo workflow by command (setup_demo was one of the guide's commands).
from io import StringIO
from django.core.management import call_command
call_command("run_workflow", "demo", "--user", "telegram:42", "--name", "Ada", "--message", "my name is Ada")
call_command("run_workflow", "demo", "--user", "telegram:42", "--message", "what is my name?", stdout=(out := StringIO()))
assert "Your name is Ada" in out.getvalue(), out.getvalue()
print("host ok", user.pk)
"""

# What `langgraph dev` does with langgraph.json: load each graph's file by path in a fresh process
# (the project on sys.path, as its "dependencies": ["."] install it), then the graph runs.
LANGGRAPH_DEV_LOAD = """
import importlib.util, json, sys
sys.path.insert(0, ".")
spec = json.load(open("langgraph.json"))
path, name = spec["graphs"]["helper"].split(":")
module_spec = importlib.util.spec_from_file_location("helper_graph", path)
module = importlib.util.module_from_spec(module_spec)
module_spec.loader.exec_module(module)
graph = getattr(module, name)
user_id = int(sys.argv[1])
out = graph.invoke({"messages": [("user", "what is my drink?")]}, {"configurable": {"user_id": user_id}})
from memory.models import Episode
episode = Episode.objects.get(pk=out["episode_id"])
assert episode.user_id == user_id and episode.success, (episode.user_id, episode.success, episode.error)
print(out["messages"][-1].content)
"""


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    # From a copy of the checkout's files (tracked, or new and not ignored): build/ and *.egg-info/
    # left by an earlier build would otherwise slip files into the sdist (setuptools reuses the
    # old SOURCES.txt) that a clean release build leaves out.
    source = tmp_path_factory.mktemp("source")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():  # a deleted file may still be listed
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    # The builder's build is git-ignored (npm writes it) but shipped: a release builds it first.
    if (REPO / BUILDER_BUILD).is_dir():
        shutil.copytree(REPO / BUILDER_BUILD, source / BUILDER_BUILD)
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def wheel(dist):
    return next(dist.glob("engram-*.whl"))


def checkout_files(*folders):
    """The checkout's files under `folders` that the apps read at run time (not Python modules)."""
    return {
        path.relative_to(REPO).as_posix()
        for folder in folders
        for path in (REPO / folder).rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc")
    }


def test_the_wheel_holds_the_apps_their_templates_and_static_files_and_no_config(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.startswith("engram-")}
    assert tops == {"memory", "workflows"}
    data = checkout_files("memory", "workflows")
    assert "memory/templates/admin/base_site.html" in data and "memory/static/memories/memories.css" in data
    assert "workflows/templates/admin/workflows/thread_change_form.html" in data
    assert data <= set(names), sorted(data - set(names))
    assert "memory/migrations/0001_initial.py" in names and "workflows/management/commands/setup_demo.py" in names
    if (REPO / BUILDER_BUILD).is_dir():  # built in this checkout: the wheel serves /builder/ without Node.js
        assert f"{BUILDER_BUILD}/index.html" in names


@pytest.fixture
def host_database():
    """The host's database: startproject's SQLite file (None), or on a PostgreSQL run (DATABASE_URL)
    the URL of a scratch database of its own on that server, dropped afterwards."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        yield None
        return
    import dj_database_url
    import psycopg

    db = dj_database_url.parse(url)
    name = f"engram_host_{os.getpid()}"
    server = {
        "dbname": "postgres",
        "user": db["USER"],
        "password": db["PASSWORD"],
        "host": db["HOST"],
        "port": db["PORT"],
    }
    server = {k: v for k, v in server.items() if v}
    with psycopg.connect(**server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield url.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(**server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_startproject_site_runs_engram_as_the_readme_says(wheel, tmp_path, host_database):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    # Engram's dependencies from this environment (after the host's own site-packages).
    (site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    host = tmp_path / "host"
    host.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "DATABASE_URL")}
    if host_database:
        env["DATABASE_URL"] = host_database  # what the guide's PostgreSQL block reads

    def run(*args, extra_env=None):
        done = subprocess.run(
            [python, *args], cwd=host, env={**env, **(extra_env or {})}, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"{args}: {done.stdout[-2000:]} {done.stderr[-3000:]}"
        return done

    def fails(*args):
        done = subprocess.run([python, *args], cwd=host, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode != 0, done.stdout
        return done.stderr

    run("-m", "django", "startproject", "mysite", ".")
    settings_py, urls_py = host / "mysite" / "settings.py", host / "mysite" / "urls.py"
    startproject_settings = settings_py.read_text()
    # Engram's two apps alone: `manage.py check` names each setting still missing.
    settings_py.write_text(startproject_settings + '\nINSTALLED_APPS = ["memory", "workflows", *INSTALLED_APPS]\n')
    missing = fails("manage.py", "check")
    assert all(
        code in missing
        for code in ("memory.E001", "memory.E002", "memory.E003", "memory.W002", "memory.W003", "memory.W004")
    ), missing
    # The guide's lines, read from the guide itself.
    database = readme_block("postgresql") if host_database else ""
    settings_py.write_text(startproject_settings + "\n" + database + "\n" + readme_block("settings"))
    with open(urls_py, "a") as urls:
        urls.write("\n" + readme_block("urls"))
    assert "no issues" in run("manage.py", "check").stdout
    # Served as in production (the project's own choice, not one of Engram's lines): no DEBUG, so
    # nothing but WhiteNoise and collectstatic serves the static files.
    with open(settings_py, "a") as production:
        production.write('\nDEBUG = False\nALLOWED_HOSTS = ["127.0.0.1"]\n')

    # The guide's commands, as written: createsuperuser without prompts, gunicorn on a free port.
    port = free_port()
    server = None
    superuser = {
        "DJANGO_SUPERUSER_USERNAME": "op",
        "DJANGO_SUPERUSER_PASSWORD": "pw-1234567",
        "DJANGO_SUPERUSER_EMAIL": "op@example.com",
    }
    try:
        for line in filter(None, readme_block("commands").splitlines()):
            args = shlex.split(line, comments=True)
            if args[0] == "python":
                if args[-1] == "createsuperuser":
                    run(*args[1:], "--no-input", extra_env=superuser)
                else:
                    run(*args[1:])
            else:
                assert args[0] == "gunicorn" and "127.0.0.1:8000" in args, line
                args = [a.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for a in args]
                with open(tmp_path / "gunicorn.log", "w") as log:  # the child keeps its own descriptor
                    server = subprocess.Popen([python, "-m", *args], cwd=host, env=env, stdout=log, stderr=log)
        assert server is not None, "the README's commands start no server"
        assert (host / "staticfiles" / "admin" / "css" / "base.css").is_file()  # collectstatic ran
        user_id = int(run("-c", HOST_SCRIPT).stdout.split("host ok", 1)[1])
        check_the_served_site(f"http://127.0.0.1:{port}", server, tmp_path / "gunicorn.log")
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)

    # The demo's conversation checkpoints went to data/ under the host's BASE_DIR on SQLite, into the
    # host's database on PostgreSQL; nothing is written inside the installed package.
    assert (host / "data" / "checkpoints.db").is_file() == (host_database is None)
    assert not [p for p in (site / "memory").rglob("*") if p.suffix in (".db", ".sqlite3")]

    # The guide's module for `langgraph dev`, loaded as langgraph dev loads it, sets Django up itself.
    (host / "mysite" / "graph.py").write_text(readme_block("graph"))
    (host / "langgraph.json").write_text(readme_block("langgraph.json"))
    env.pop("DJANGO_SETTINGS_MODULE", None)
    answer = run("-c", LANGGRAPH_DEV_LOAD, str(user_id)).stdout
    assert "Your drink is green tea" in answer, answer


def check_the_served_site(base, server, log_path):
    """What a person sees of the gunicorn-served host: a styled admin, API docs with their own
    assets, a schema with its error answers, and the demo workflow run through the REST API."""
    import httpx

    with httpx.Client(base_url=base, timeout=10) as client:
        for _ in range(150):
            assert server.poll() is None, log_path.read_text()[-3000:]
            try:
                if client.get("/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        else:
            raise AssertionError(f"gunicorn did not answer: {log_path.read_text()[-3000:]}")
        login = client.get("/memories/login/")
        assert login.status_code == 200 and 'id="login-form"' in login.text, login.status_code
        styles = re.findall(r'<link rel="stylesheet" href="([^"]+)"', login.text)
        assert any(href.endswith("admin/css/base.css") for href in styles), styles
        for href in styles:
            css = client.get(href)
            assert (css.status_code, css.headers["content-type"].split(";")[0]) == (200, "text/css"), href
        token = client.cookies["csrftoken"]
        signed_in = client.post(
            "/memories/login/",
            data={"username": "op", "password": "pw-1234567", "csrfmiddlewaretoken": token, "next": "/api/docs/"},
            headers={"Referer": f"{base}/memories/login/"},
            follow_redirects=True,
        )
        assert signed_in.status_code == 200 and str(signed_in.url).endswith("/api/docs/"), signed_in.url
        assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css|png))"', signed_in.text)
        assert assets and all(a.startswith("/static/drf_spectacular_sidecar/") for a in assets), assets
        for asset in assets:
            got = client.get(asset)
            assert got.status_code == 200, asset
            kind = got.headers["content-type"]
            assert any(k in kind for k in ("javascript", "text/css", "image/png")), (asset, kind)
        schema = client.get("/api/schema/", params={"format": "json"})
        assert schema.status_code == 200
        listing = schema.json()["paths"]["/api/v1/facts/"]["get"]["responses"]
        assert {"200", "400", "401", "403", "404"} <= set(listing), sorted(listing)
        # The demo workflow through the REST API, with the operator's session.
        headers = {"X-CSRFToken": client.cookies["csrftoken"], "Referer": f"{base}/api/docs/"}
        for message in ("my name is Grace", "what is my name?"):
            ran = client.post(
                "/api/v1/workflows/demo/run/", json={"message": message, "user_name": "grace"}, headers=headers
            )
            assert ran.status_code == 200, ran.text
            assert ran.json()["memory_errors"] == [], ran.json()
        assert "Your name is Grace" in ran.json()["reply"], ran.json()


def test_install_hints_name_what_an_index_or_a_checkout_has():
    """`engram` is on no package index: a hint may install it from a checkout (`-e .`, a path, a wheel),
    never as `engram[extra]`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    offenders = [
        name
        for name in filter(None, listed.split("\0"))
        if name.endswith((".py", ".md", ".sh", ".toml", ".html", ".txt"))
        and (REPO / name).is_file()
        and re.search(r"pip install[^\n]*['\"]?engram\[", (REPO / name).read_text(errors="replace"))
    ]
    assert offenders == []
