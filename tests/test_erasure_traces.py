"""Erasure checked where data really hides: planner statistics, sessions, operator queries, JSON escapes, WAL.

A person with a non-ASCII name, a secret, a chat id and an e-mail talks to the demo workflow; an operator
searches the admin for them (the admin keeps the search in the session) and recalls with their name in the
query; on PostgreSQL, ANALYZE copies their values into `pg_stats`. `memory verify-erasure` must find each of
those traces before the forget, and after it find none where an independent scan (every row of every table,
`pg_stats`, the decoded sessions, the raw SQLite files) finds none either.
"""

import io
import json
from pathlib import Path
from urllib.parse import unquote_plus

import pytest
from django.contrib.sessions.models import Session
from django.core.management import CommandError, call_command
from django.db import connection

from memory.operations.erasure import find_traces
from memory.operations.filebytes import count_in_files
from workflows.conversations.checkpointer import checkpoint_path, checkpointer_kind
from workflows.graph.runtime import run_workflow

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "Łucja Wąsowska"
SECRET = "zq-pin-7731"
CHAT_ID = "918273645"
EMAIL = "lucja.w@example.org"
NEEDLES = [NAME, "Wąsowska", SECRET, CHAT_ID, EMAIL]


def escaped(needle):
    """The needle as a JSON encoder writes it by default (\\u0141ucja for Łucja)."""
    return json.dumps(needle)[1:-1]


def forms(needle):
    return {needle.lower(), escaped(needle).lower()}


@pytest.fixture
def person(demo_workflow, service, admin_client):
    """The person, their traces in the memory tables, a bystander recalled for with their name, an admin search."""
    payload = {"user_id": CHAT_ID, "display_name": NAME}
    for text in (f"my name is {NAME}", f"my pin is {SECRET}", "what is my pin?"):
        result = run_workflow(demo_workflow, {"type": "chat", "payload": {**payload, "message": text}})
    user_id = result.user["id"]
    alias, _ = service.get_or_create_user("email", EMAIL, display_name=NAME)
    service.set_fact("full_name", {"given": NAME, "pin": SECRET}, scope="user", user_id=alias.pk)
    service.merge_users(alias.pk, user_id)
    bystander, _ = service.get_or_create_user("chat", "bystander-1", display_name="Bob")
    service.set_fact("drink", "tea with lemon", scope="user", user_id=bystander.pk)
    # An operator looks the person up: in the admin (kept in the session) and with a recall naming them.
    assert admin_client.get("/memories/memory/memoryuser/", {"q": NAME}).status_code == 200
    assert service.recall(f"{NAME} tea", user_id=bystander.pk).hits
    service.flush_recall_log()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")  # what autovacuum does on its own schedule: the values go to pg_stats
    return {"id": user_id, "alias": alias.pk, "bystander": bystander.pk}


def verify(person):
    args = [NAME, f"chat:{CHAT_ID}", EMAIL, "--text", SECRET, "--text", "Wąsowska"]
    args += ["--user-id", str(person["id"]), "--user-id", str(person["alias"])]
    out = io.StringIO()
    try:
        call_command("memory", "verify-erasure", *args, stdout=out)
    except CommandError:
        return False, out.getvalue()
    return True, out.getvalue()


def independent_scan():
    """Every trace of the needles, found without memory/erasure: every row of every table read in
    Python, pg_stats as text, every session decoded, and the raw bytes of the SQLite files."""
    found = []
    wanted = set().union(*(forms(n) for n in NEEDLES))
    hex_wanted = {n.encode().hex() for n in NEEDLES} | {n.lower().encode().hex() for n in NEEDLES}
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            try:
                cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            except Exception:  # noqa: BLE001  (FTS5 virtual tables: their shadow tables are read instead)
                continue
            for row in cursor.fetchall():
                for value in row:
                    if isinstance(value, memoryview | bytes):
                        text = bytes(value).decode("utf-8", "replace")
                    else:
                        text = str(value)
                    if any(w in text.lower() for w in wanted):
                        found.append((table, text[:80]))
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT tablename, attname, concat_ws(' ', most_common_vals::text, histogram_bounds::text, "
                "most_common_elems::text) FROM pg_stats WHERE schemaname = current_schema()"
            )
            for table, column, text in cursor.fetchall():
                lowered = (text or "").lower()
                if any(w in lowered for w in wanted) or any(h in lowered for h in hex_wanted):
                    found.append((f"pg_stats {table}.{column}", lowered[:80]))
    for session in Session.objects.all():
        text = unquote_plus(json.dumps(session.get_decoded(), ensure_ascii=False)).lower()
        if any(w in text for w in wanted):
            found.append(("django_session", text[:80]))
    if connection.vendor == "sqlite":
        paths = []
        for base in (Path(connection.settings_dict["NAME"]), checkpoint_path()):
            paths += [base, *(Path(f"{base}{suffix}") for suffix in ("-wal", "-shm", "-journal"))]
        needles = sorted(set().union(*(forms(n) for n in NEEDLES)))
        for path, counts in count_in_files(paths, needles).items():
            found += [(path, needle) for needle, hits in counts.items() if hits]
    elif checkpointer_kind() == "sqlite":
        raise AssertionError("the test expects the checkpointer of the database")
    return found


def trace_classes(traces):
    return {where for where, _ in traces}


def test_verify_erasure_finds_each_trace_class_before_the_forget(person):
    traces = find_traces([*NEEDLES, "Łucja"], [person["id"], person["alias"]])
    places = trace_classes(traces)
    assert "django_session" in places, traces  # the admin search, kept for the tab
    assert "memory_recall_event.query" in places, traces  # the operator's recall of the bystander
    assert "memory_memoryuser.display_name" in places
    if connection.vendor == "postgresql":
        stats = [w for w in places if w.startswith("pg_stats ")]
        assert "pg_stats memory_channelidentity.external_id" in stats, traces
        assert "pg_stats memory_memoryuser.display_name" in stats, traces
    else:
        # JSON columns keep non-ASCII text escaped: the escaped form is searched too.
        fact_values = [what for where, what in traces if where == "memory_fact.value"]
        assert any("u0141ucja" in what for what in fact_values), traces
        assert any(where.endswith((".sqlite3", ".sqlite3-wal")) for where in places), traces
    ok, _ = verify(person)
    assert not ok


def test_forget_leaves_nothing_that_verify_erasure_or_an_independent_scan_finds(person, admin_client):
    assert independent_scan()  # the scan sees the traces too
    response = admin_client.post(
        "/api/v1/memory-users/batch-delete/", {"ids": [person["id"]], "cascade": True}, content_type="application/json"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["erasure"]["complete"] is True, body
    assert body["erasure"]["problems"] == []
    ok, out = verify(person)
    assert ok and out.startswith("0 traces"), out
    assert independent_scan() == []
    # The operator is still signed in (only the keys naming the person went) and the bystander stays.
    assert admin_client.get("/memories/memory/memoryuser/").status_code == 200
    from memory.models import Fact

    assert Fact.objects.filter(user_id=person["bystander"]).exists()


@pytest.mark.postgres
def test_forget_refreshes_the_statistics_of_the_tables_it_touched(person, service):
    assert [t for t in find_traces(NEEDLES) if t[0].startswith("pg_stats")]
    result = service.delete_users([person["id"]], cascade=True)
    assert result.erasure.complete, result.erasure
    assert "memory_channelidentity" in result.erasure.statistics_refreshed
    assert not [t for t in find_traces(NEEDLES) if t[0].startswith("pg_stats")]


def test_a_wal_a_reader_keeps_is_reported_not_claimed_erased(person, service, settings):
    """SQLite: a reader holding old WAL frames past the bounded wait: the result says so, never success."""
    import sqlite3

    if connection.vendor != "sqlite":
        pytest.skip("SQLite files only")
    settings.MEMORY = {**settings.MEMORY, "ERASURE_WAL_WAIT_SECONDS": 0.5}
    reader = sqlite3.connect(connection.settings_dict["NAME"])
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM memory_fact").fetchone()  # a snapshot from before the delete
    try:
        result = service.delete_users([person["id"]], cascade=True)
    finally:
        reader.rollback()
        reader.close()
    assert not result.erasure.complete
    assert any("WAL" in p for p in result.erasure.problems), result.erasure


def test_a_wal_reader_that_lets_go_within_the_wait_is_waited_for(person, service, settings):
    """SQLite: the truncation is retried until the reader lets go (within the bounded wait)."""
    import sqlite3
    import threading

    if connection.vendor != "sqlite":
        pytest.skip("SQLite files only")
    settings.MEMORY = {**settings.MEMORY, "ERASURE_WAL_WAIT_SECONDS": 20}
    reader = sqlite3.connect(connection.settings_dict["NAME"], check_same_thread=False)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM memory_fact").fetchone()
    timer = threading.Timer(1.0, reader.rollback)
    timer.start()
    try:
        result = service.delete_users([person["id"]], cascade=True)
    finally:
        timer.join()
        reader.close()
    assert result.erasure.complete, result.erasure
    db = connection.settings_dict["NAME"]
    counts = count_in_files([f"{db}-wal"], sorted(forms(SECRET) | forms(NAME)))
    assert not any(counts.get(f"{db}-wal", {}).values())
