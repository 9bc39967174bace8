#!/usr/bin/env bash
# Set up the virtualenvs and run the tests: on SQLite, then on PostgreSQL when DATABASE_URL is set.
#
# Recall runs hybrid by default, as scripts/serve.sh serves it: `.venv` gets the `embeddings` extra
# (torch first: `pip install torch==2.13.0` is a CPU build on this kind of machine, where plain `torch`
# would fetch a CUDA build of several GB). Keyword-only recall, with no embedding package at all,
# is tested in a second virtualenv, `.venv-keyword`.
#
# ENGRAM_RECALL chooses what runs (extra arguments go to pytest in every pass, e.g. -k search):
#   both (default)  the whole suite keyword-only, then the tests of what the model changes, hybrid
#   keyword         the whole suite keyword-only
#   hybrid          the whole suite hybrid (twice the time: the model embeds every test write)
set -euo pipefail
cd "$(dirname "$0")/.."
recall="${ENGRAM_RECALL:-both}"
case "$recall" in both | keyword | hybrid) ;; *) echo "ENGRAM_RECALL must be both, keyword or hybrid, not '$recall'" >&2; exit 2 ;; esac
# What the embedding model changes: recall and its API, consolidation, export and import, health,
# the workflow runs that recall, the embedding worker, failing closed, erasure, the LangGraph store,
# a user's own graph, async, the memory graph, promotion (it reads recall's events).
HYBRID_TESTS=(
  tests/test_recall_local_model.py tests/test_recall.py tests/test_recall_vectors.py tests/test_recall_api.py
  tests/test_consolidation.py tests/test_transfer.py tests/test_health.py
  tests/test_workflows_nodes.py tests/test_workflows_telegram.py tests/test_workflows_agent.py
  tests/test_indexer.py tests/test_fail_closed.py tests/test_erasure.py
  tests/test_store.py tests/test_langgraph_api.py tests/test_async.py
  tests/test_relations.py tests/test_promotion.py tests/test_tasks.py
)

setup() {  # setup VENV [EXTRA]: create the virtualenv and install Engram with the dev extra (and EXTRA)
  local venv="$1" extra="${2:-}"
  if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
  fi
  if [ "$extra" = "embeddings" ]; then
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "torch==${ENGRAM_TORCH_VERSION:-2.13.0}"
  fi
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[dev,docs,cluster${extra:+,$extra}]"
}

# The Celery tests (tests/test_tasks.py) need the broker: Redis at 127.0.0.1:6379, started here when
# it is installed and not running yet (they are skipped without it).
if command -v redis-server > /dev/null && ! (command -v redis-cli > /dev/null && redis-cli -h 127.0.0.1 ping > /dev/null 2>&1); then
  redis-server --port 6379 --bind 127.0.0.1 --save "" --daemonize yes > /dev/null
fi

suite() {  # suite VENV LABEL PYTEST-ARGS...: the tests on SQLite, then on PostgreSQL when DATABASE_URL is set
  local venv="$1" label="$2"
  shift 2
  echo "== tests on SQLite (${label}, ${venv})"
  env -u DATABASE_URL "$venv/bin/python" -m pytest "$@"
  if [ -n "${DATABASE_URL:-}" ]; then
    echo "== tests on PostgreSQL ($(echo "$DATABASE_URL" | sed -E 's#//[^@]*@#//#'), ${label}, ${venv})"
    "$venv/bin/python" -m pytest "$@"
  fi
}

if [ "$recall" != "hybrid" ]; then
  setup .venv-keyword
fi
if [ "$recall" != "keyword" ]; then
  setup .venv embeddings
fi
lint_venv=.venv
[ "$recall" = "keyword" ] && lint_venv=.venv-keyword
echo "== style and import layers (ruff check, ruff format --check, lint-imports), docs (mkdocs build --strict)"
"$lint_venv/bin/ruff" check .
"$lint_venv/bin/ruff" format --check .
"$lint_venv/bin/lint-imports"
# The site is built into a temporary folder, never committed; --strict fails on a broken link or
# anchor. Its node-types page is generated from the registry (docs/hooks/node_types.py), which
# needs Django set up but no database and no embedding model.
docs_site="$(mktemp -d)"
env -u DATABASE_URL ENGRAM_EMBEDDINGS=none ENGRAM_LOG_LEVEL=ERROR NO_MKDOCS_2_WARNING=1 "$lint_venv/bin/mkdocs" build --strict --quiet --site-dir "$docs_site"
rm -rf "$docs_site"

# The builder: installed from the lockfile, built (the browser tests open the build), its unit tests.
echo "== builder (frontend/): npm ci, npm run build, vitest"
scripts/build_frontend.sh --force
(cd frontend && npm test --silent)

if [ "$recall" != "hybrid" ]; then
  suite .venv-keyword "keyword-only recall" "$@"
fi
if [ "$recall" = "hybrid" ]; then
  suite .venv "hybrid recall" "$@"
elif [ "$recall" = "both" ]; then
  if [ $# -gt 0 ]; then
    suite .venv "hybrid recall" "$@"
  else
    suite .venv "hybrid recall" "${HYBRID_TESTS[@]}"
  fi
fi
# LangGraph's own store suite (from PyPI's sdist) against EngramStore, with InMemoryStore as the reference.
if [ $# -eq 0 ]; then
  store_venv=.venv
  [ "$recall" = "keyword" ] && store_venv=.venv-keyword
  echo "== LangGraph's store suite on SQLite"
  env -u DATABASE_URL scripts/langgraph_store_suite/run.sh "$PWD/$store_venv/bin/python"
  if [ -n "${DATABASE_URL:-}" ]; then
    echo "== LangGraph's store suite on PostgreSQL"
    scripts/langgraph_store_suite/run.sh "$PWD/$store_venv/bin/python"
  fi
fi
[ -n "${DATABASE_URL:-}" ] || echo "== PostgreSQL runs skipped: set DATABASE_URL=postgres://user@host:5432/name to run the suite there too"
