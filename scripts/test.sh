#!/usr/bin/env bash
# Set up a virtualenv in .venv and run the tests: on SQLite, then on PostgreSQL when DATABASE_URL is set.
# Extra arguments go to pytest (e.g. scripts/test.sh -k search).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'

postgres_url="${DATABASE_URL:-}"
echo "== tests on SQLite"
env -u DATABASE_URL .venv/bin/python -m pytest "$@"
if [ -n "$postgres_url" ]; then
  echo "== tests on PostgreSQL ($(echo "$postgres_url" | sed -E 's#//[^@]*@#//#'))"
  DATABASE_URL="$postgres_url" .venv/bin/python -m pytest "$@"
else
  echo "== PostgreSQL run skipped: set DATABASE_URL=postgres://user@host:5432/name to run the suite there too"
fi
