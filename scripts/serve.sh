#!/usr/bin/env bash
# Set up a virtualenv in .venv, migrate the database (SQLite in platform/data/ unless DATABASE_URL
# is set), create the demo workflow and serve the site at http://127.0.0.1:8000/ (admin at /memories/).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
.venv/bin/python manage.py migrate --no-input
.venv/bin/python manage.py setup_demo
if [ -n "${ENGRAM_ADMIN_PASSWORD:-}" ]; then
  .venv/bin/python manage.py ensure_admin --username "${ENGRAM_ADMIN_USER:-admin}"
fi
exec .venv/bin/python manage.py runserver "${ENGRAM_BIND:-127.0.0.1:8000}"
