"""Engram as a library: the wheel holds the two apps with their templates and static files (and no
`config` package), and a project made by `django-admin startproject` runs Engram after the steps the
README gives ("Add Engram to an existing Django project").

The host gets a fresh virtualenv with the wheel installed into it; its other dependencies come from
this test's environment (a path entry), so nothing is downloaded and Engram's checkout is not on its path.
"""

import os
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

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
from django.test import Client
from memory.service import MemoryService

assert "site-packages" in memory.__file__, memory.__file__
service = MemoryService()
user, _ = service.get_or_create_user("chat", "ada")
service.set_fact("drink", "green tea", scope="user", user_id=user.pk)
hits = service.recall("what does she drink", user_id=user.pk)
assert [h.item.value for h in hits][:1] == ["green tea"], hits
client = Client()
assert client.get("/healthz").status_code == 200
assert client.get("/memories/").status_code == 302  # to the login page
staff = get_user_model().objects.create_user("op", password="pw-1234567", is_staff=True, is_superuser=True)
client.force_login(staff)
page = client.get("/memories/", follow=True)  # to the first tab
assert page.status_code == 200 and b"memories-tabs" in page.content, page.status_code
assert client.get("/api/v1/facts/").json()["count"] == 1
assert client.get("/api/schema/").status_code == 200
print("host ok")
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        check=True,
        capture_output=True,
    )
    return next(out.glob("engram-*.whl"))


def test_the_wheel_holds_the_apps_their_templates_and_static_files_and_no_config(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.startswith("engram-")}
    assert tops == {"memory", "workflows"}
    assert "memory/templates/admin/base_site.html" in names
    assert "memory/static/memories/memories.css" in names
    assert "workflows/templates/admin/workflows/thread_change_form.html" in names
    assert "memory/migrations/0001_initial.py" in names and "workflows/management/commands/setup_demo.py" in names


def test_a_startproject_site_runs_engram_as_the_readme_says(wheel, tmp_path):
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

    run("-m", "django", "startproject", "hostsite", ".")
    with open(host / "hostsite" / "settings.py", "a") as settings:
        settings.write(textwrap.dedent(HOST_SETTINGS))
    with open(host / "hostsite" / "urls.py", "a") as urls:
        urls.write(textwrap.dedent(HOST_URLS))
    assert "no issues" in run("manage.py", "check").stdout
    run("manage.py", "migrate", "--no-input")
    assert "host ok" in run("-c", HOST_SCRIPT).stdout
