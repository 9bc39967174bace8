"""Engram as a library: the wheel holds the two apps with their templates and static files (and no
`config` package), and a project made by `django-admin startproject` runs Engram after the steps the
README gives ("Add Engram to an existing Django project").

The sdist is built from the checkout and the wheel from the sdist (`python -m build`), as a release
is, so a file missing from either fails here. The build runs without isolation, on the setuptools and
build of the `dev` extra, so it needs no network and always runs. The host gets a fresh virtualenv
with the wheel installed into it; its other dependencies come from this test's environment (a path
entry), so nothing is downloaded and Engram's checkout is not on its path.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

REPO = Path(__file__).resolve().parent.parent
BUILDER_BUILD = "workflows/static/workflows/builder"

# What the README tells a host project to add to its settings.py and urls.py.
HOST_SETTINGS = """
INSTALLED_APPS = [
    "memory",
    "workflows",
    *INSTALLED_APPS,
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
]
REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}
"""
HOST_SQLITE = """
DATABASES["default"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE"}  # SQLite: writers queue, never fail
"""
HOST_URLS = """
from django.urls import include
urlpatterns += [path("", include("memory.urls")), path("", include("workflows.urls"))]
"""
HOST_SCRIPT = """
import django, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hostsite.settings")
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
login = client.get("/memories/login/")
assert login.status_code == 200 and b'id="login-form"' in login.content, login.status_code
staff = get_user_model().objects.create_user("op", password="pw-1234567", is_staff=True, is_superuser=True)
client.force_login(staff)
page = client.get("/memories/", follow=True)  # to the first tab
assert page.status_code == 200 and b"memories-tabs" in page.content, page.status_code
assert client.get("/api/v1/facts/").json()["count"] == 1
assert client.get("/api/schema/").status_code == 200
print("host ok")
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
    """The host's DATABASES line: startproject's SQLite file, or on a PostgreSQL run (DATABASE_URL)
    a scratch database of its own on that server, dropped afterwards."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        yield HOST_SQLITE
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
        yield f"\nDATABASES = {{'default': {{**{dict(db, NAME=name)!r}, 'CONN_MAX_AGE': 0}}}}\n"
    finally:
        with psycopg.connect(**server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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

    def run(*args):
        done = subprocess.run([python, *args], cwd=host, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{args}: {done.stderr[-3000:]}"
        return done

    def fails(*args):
        done = subprocess.run([python, *args], cwd=host, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode != 0, done.stdout
        return done.stderr

    run("-m", "django", "startproject", "hostsite", ".")
    settings_py, urls_py = host / "hostsite" / "settings.py", host / "hostsite" / "urls.py"
    startproject_settings = settings_py.read_text()
    # Engram's two apps alone: `manage.py check` names each setting still missing.
    settings_py.write_text(startproject_settings + '\nINSTALLED_APPS = ["memory", "workflows", *INSTALLED_APPS]\n')
    missing = fails("manage.py", "check")
    assert all(code in missing for code in ("memory.E001", "memory.E002", "memory.E003")), missing
    settings_py.write_text(startproject_settings + textwrap.dedent(HOST_SETTINGS) + host_database)
    with open(urls_py, "a") as urls:
        urls.write(textwrap.dedent(HOST_URLS))
    assert "no issues" in run("manage.py", "check").stdout
    run("manage.py", "migrate", "--no-input")
    assert "host ok" in run("-c", HOST_SCRIPT).stdout
    # A workflow with conversation memory: its checkpoints go to data/ under the host's BASE_DIR on
    # SQLite, into the host's database on PostgreSQL; nothing is written inside the installed package.
    run("manage.py", "setup_demo")
    run("manage.py", "run_workflow", "demo", "--user", "telegram:42", "--name", "Ada", "--message", "my name is Ada")
    reply = run("manage.py", "run_workflow", "demo", "--user", "telegram:42", "--message", "what is my name?").stdout
    assert "Your name is Ada" in reply, reply
    assert (host / "data" / "checkpoints.db").is_file() == (host_database == HOST_SQLITE)
    assert not [p for p in (site / "memory").rglob("*") if p.suffix in (".db", ".sqlite3")]
