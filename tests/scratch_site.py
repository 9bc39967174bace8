"""A scratch site for tests that run Engram in other processes (gunicorn, uvicorn, manage.py): its own
migrated database, PostgreSQL when the suite runs there, else a SQLite file, dropped afterwards."""

import socket
import subprocess
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def scratch_site(name, *, vendor, settings_dict, data, env, setup):
    """Migrate a scratch database named after `name` for the processes run with `env` (DATABASE_URL is
    set in it), run the `setup` script in `manage.py shell`, and yield the last line it printed."""
    scratch = None
    if vendor == "postgresql":
        import psycopg

        scratch = f"engram_{name}_{uuid.uuid4().hex[:8]}"
        auth = settings_dict["USER"] + (f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else "")
        base = f"postgres://{auth}@{settings_dict['HOST'] or '127.0.0.1'}:{settings_dict['PORT'] or 5432}"
        with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{scratch}"')
        env["DATABASE_URL"] = f"{base}/{scratch}"
    else:
        env["DATABASE_URL"] = f"sqlite:///{data}/{name}.sqlite3"
    manage = [sys.executable, str(REPO / "manage.py")]
    try:
        subprocess.run(
            [*manage, "migrate", "--no-input", "-v", "0"], env=env, cwd=REPO, check=True, capture_output=True
        )
        done = subprocess.run(
            [*manage, "shell", "-v", "0", "-c", setup], env=env, cwd=REPO, check=True, capture_output=True, text=True
        )
        yield done.stdout.strip().splitlines()[-1]
    finally:
        if scratch:
            import psycopg

            with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')
