#!/usr/bin/env bash
# Property-based run of the whole REST API from its OpenAPI schema (schemathesis), as a staff token,
# against the site under gunicorn (2 workers x 2 threads, as it is deployed) on a throw-away SQLite
# database. Extra arguments go to `schemathesis run` (e.g. scripts/api_fuzz.sh --max-examples 200).
# Exits non-zero on any 5xx, schema mismatch, or traceback in the server's log.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'

data_dir="$(mktemp -d)"
port="${ENGRAM_FUZZ_PORT:-8765}"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$data_dir"
}
trap cleanup EXIT
export ENGRAM_DATA_DIR="$data_dir"
unset DATABASE_URL
.venv/bin/python manage.py migrate --no-input -v 0
# A staff user with a token, a few memories of each kind written through the service, and threads.
token="$(.venv/bin/python manage.py shell -v 0 -c '
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from memory.service import MemoryService
staff = get_user_model().objects.create_user("fuzz-operator", is_staff=True)
memory = MemoryService()
for n in range(5):
    user, _ = memory.get_or_create_user("telegram", 100 + n, display_name=f"User {n}")
    memory.link_identity(user.pk, "email", f"user{n}@example.org")
    memory.set_fact(f"favourite_colour_{n}", "green", scope="user", user_id=user.pk, fact_type="user_preference")
    memory.set_fact(f"office_{n}", {"city": "Lyon"}, scope="agent", agent_id="support")
    episode = memory.start_episode(agent_id="support", user_id=user.pk, trigger_type="telegram")
    memory.complete_episode(episode.pk, success=n % 2 == 0, summary=f"run {n}")
    memory.save_procedure(f"procedure_{n}", trigger_conditions={"goal_contains": ["weather"]})
# Conversation threads with checkpoints, through a real run of the demo workflow.
from workflows.demo import ensure_demo_workflow
from workflows.graph.runtime import run_workflow
demo, _ = ensure_demo_workflow()
for n in range(3):
    run_workflow(demo, {"type": "chat", "payload": {"user_id": f"chat-{n}", "message": "my name is Ann"}})
# The demo stays active, so its run endpoint is fuzzed too. positive_data_acceptance is left out of
# the checks: run payloads and workflow definitions obey rules JSON Schema cannot say (one of
# email/user_id/user_name; known node types, no dangling edge or endless cycle), so a schema-valid
# body may rightly get a 400 naming the field.
print(Token.objects.create(user=staff).key)
')"
PYTHONPATH="platform:." .venv/bin/python -m gunicorn --config platform/gunicorn.conf.py --workers 2 --threads 2 \
  --bind "127.0.0.1:${port}" \
  config.wsgi:application >"$data_dir/server.log" 2>&1 &
server_pid=$!
status=0
.venv/bin/schemathesis run "http://127.0.0.1:${port}/api/schema/?format=json" \
  --header "Authorization: Token ${token}" \
  --wait-for-schema 30 --checks all --exclude-checks positive_data_acceptance --max-examples "${ENGRAM_FUZZ_EXAMPLES:-25}" --seed "${ENGRAM_FUZZ_SEED:-1}" \
  --workers 1 --generation-database none --no-color "$@" || status=$?
if grep -q "Traceback" "$data_dir/server.log"; then
  echo "the server logged unhandled exceptions:"; grep -A 30 "Traceback" "$data_dir/server.log" | head -80
  status=1
fi
exit "$status"
