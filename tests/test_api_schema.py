"""The whole API against its own OpenAPI schema: schemathesis, as a staff token, over a real HTTP server.

Every operation gets a fixed number of generated requests (positive and negative, plus stateful
sequences) with a fixed seed; any 5xx, undocumented status or content type, or response that does
not match the schema fails the test. `scripts/api_fuzz.sh` runs the same check longer, by hand.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rest_framework.authtoken.models import Token

from memory.buffers import flush_all
from memory.models import MemoryRelation, StoreItem
from workflows.conversations.reminders import schedule_reminder
from workflows.models import Reminder
from workflows.store import EngramStore

pytestmark = [pytest.mark.schemathesis, pytest.mark.django_db(transaction=True)]

EXAMPLES = os.environ.get("ENGRAM_FUZZ_EXAMPLES", "10")


def test_every_operation_conforms_to_the_schema(live_server, django_user_model, service, user_factory, tmp_path):
    cli = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")
    assert cli, "schemathesis is a dev dependency: pip install -e '.[dev]'"
    token = Token.objects.create(user=django_user_model.objects.create_user("fuzz", is_staff=True)).key
    for n in range(3):
        user = user_factory(f"user-{n}")
        service.link_identity(user.pk, "email", f"user{n}@example.org")
        service.set_fact(f"colour_{n}", "green", scope="user", user_id=user.pk, fact_type="user_preference")
        service.set_fact(f"office_{n}", {"city": "Lyon"}, scope="agent", agent_id="support")
        episode = service.start_episode(agent_id="support", user_id=user.pk)
        service.complete_episode(episode.pk, success=True, summary=f"run {n}")
        service.save_procedure(f"procedure_{n}")
    # Rows for the graph and ledger endpoints too: a replaced value (versions and a contradicts edge),
    # a session fact recalled often enough to be promoted, a store item and a reminder.
    service.set_fact(f"colour_{n}", "blue", scope="user", user_id=user.pk, fact_type="user_preference")
    service.set_fact("favourite_snack", "figs", scope="session", session_id="s1", fact_type="user_preference")
    for _ in range(3):
        assert service.recall("favourite snack", agent_id="support", user_id=user.pk, session_id="s1")
    assert service.promote().promoted
    EngramStore().put(("notes", "support"), "tea", {"text": "green tea, no sugar"})
    schedule_reminder(user_id=user.pk, when="in 2 hours", message="water the plants")
    flush_all()
    assert MemoryRelation.objects.filter(relation="contradicts").exists()
    assert StoreItem.objects.exists() and Reminder.objects.exists()
    from workflows.demo import ensure_demo_workflow
    from workflows.graph.runtime import run_workflow

    demo, _ = ensure_demo_workflow()
    for n in range(2):  # conversation threads with checkpoints, for the checkpoints endpoints
        run_workflow(demo, {"type": "chat", "payload": {"user_id": f"chat-{n}", "message": "hello"}})
    # The demo stays active, so its run endpoint is fuzzed too. positive_data_acceptance is left out of
    # the checks: run payloads and workflow definitions obey rules JSON Schema cannot say (one of
    # email/user_id/user_name; known node types, no dangling edge or endless cycle), so a schema-valid
    # body may rightly get a 400 naming the field.
    result = subprocess.run(
        [
            cli,
            "run",
            f"{live_server.url}/api/schema/?format=json",
            "--header",
            f"Authorization: Token {token}",
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
            "--max-examples",
            EXAMPLES,
            "--seed",
            "1",
            "--workers",
            "2",  # two clients: generating and checking cases is most of the time, and there are two cores
            "--generation-database",
            "none",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        # Schemathesis keeps the failing cases of a run in ./.schemathesis and replays them on the next run
        # (--generation-database none does not stop that): each run starts from the seed alone.
        cwd=tmp_path,
    )
    report = _failures(result.stdout)
    assert result.returncode == 0, report
    summary = result.stdout.split("SUMMARY")[-1]
    assert "passed" in summary and "failure" not in summary, report


def _failures(output):
    """What a failing run needs to be read: from its first ERRORS or FAILURES section on, each problem's
    details (operation, check, the request to reproduce it, the response), the warnings and the summary."""
    section = re.search(r"^=+ (ERRORS|FAILURES) =+$", output, re.MULTILINE)
    return output[section.start() :] if section else output[-3000:]
