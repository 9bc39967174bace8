#!/usr/bin/env bash
# LangGraph's own SqliteStore test suite against EngramStore and against InMemoryStore (the reference).
#
#   scripts/langgraph_store_suite/run.sh [PYTHON]     (default: .venv/bin/python)
#
# The suite ships in the sdist of langgraph-checkpoint-sqlite on PyPI (the version installed); it is
# downloaded into a temporary folder and never committed. Its `SqliteStore` import is rebound to
# shim.py; tests of SqliteStore's own internals (its SQL helpers and migrations) run unchanged.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
python="${1:-$repo/.venv/bin/python}"
version="$("$python" -c 'import importlib.metadata as m; print(m.version("langgraph-checkpoint-sqlite"))')"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$python" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
  "langgraph-checkpoint-sqlite==$version" -d "$work" 2>"$work/pip.log" ||
  { cat "$work/pip.log" >&2; echo "could not download the sdist of langgraph-checkpoint-sqlite $version" >&2; exit 1; }
tar xzf "$work"/langgraph_checkpoint_sqlite-*.tar.gz -C "$work"
suite="$work/suite"
mkdir "$suite"
sed 's/^from langgraph\.store\.sqlite import SqliteStore$/from shim import SqliteStore/' \
  "$work"/langgraph_checkpoint_sqlite-*/tests/test_store.py >"$suite/test_store.py"
cp "$repo/scripts/langgraph_store_suite/shim.py" "$repo/scripts/langgraph_store_suite/conftest.py" "$suite/"
echo "LangGraph's SqliteStore suite (langgraph-checkpoint-sqlite $version, its sdist's tests/test_store.py)"
for kind in inmemory engram; do
  (cd "$suite" && STORE_UNDER_TEST="$kind" PYTHONPATH="$suite:$repo/platform:$repo" DJANGO_SETTINGS_MODULE=config.settings \
    "$python" -m pytest test_store.py -q -p no:cacheprovider -c /dev/null --rootdir "$suite" -p pytest_django \
    -o asyncio_mode=auto -W ignore "${@:2}" >"$work/$kind.log" 2>&1 || true)
  echo "$kind: $(tail -n 1 "$work/$kind.log")"
  grep -E "^(FAILED|ERROR) " "$work/$kind.log" | cut -d' ' -f2 | sort >"$work/$kind.failed" || true
done
regressions="$(comm -23 "$work/engram.failed" "$work/inmemory.failed")"
echo "tests InMemoryStore passes and EngramStore fails: $(printf '%s' "$regressions" | grep -c . || true)"
[ -z "$regressions" ] || { echo "$regressions"; exit 1; }
