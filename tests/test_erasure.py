"""Forgetting a person, proven: nothing that named them is left in any table, index or database file.

The person talks to the demo workflow (a thread with checkpoints, facts, episodes), is recalled for
(recall events), has a second identity merged in, and is then forgotten through the REST API.
`memory verify-erasure` must find nothing, and on SQLite neither may a byte search of the database
files and their WAL. Transactional: the deletion must really commit, and the files really be written.
"""

import io
import json
import logging
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from memory.models import DeletionRecord, Fact, MemoryUser
from memory.operations.filebytes import count_in_files
from workflows.conversations.checkpointer import checkpoint_path
from workflows.conversations.reminders import schedule_reminder
from workflows.graph.runtime import run_workflow

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "Zelda Quartermaine"
SECRET = "8812-omega"
STEM = b"quartermain"  # what any index would keep of the name (porter stems "quartermaine")


def talk(workflow, text):
    return run_workflow(workflow, {"type": "chat", "payload": {"user_id": "zq", "display_name": NAME, "message": text}})


@pytest.fixture
def person(demo_workflow, service):
    """A person with facts, episodes, a thread with checkpoints, recall events, a reminder and a merged alias."""
    for text in (f"my locker code is {SECRET}", "my sister is Dana Quartermaine", "what is my locker code?"):
        result = talk(demo_workflow, text)
    user_id = result.user["id"]
    assert service.recall("locker code", user_id=user_id).hits
    service.flush_recall_log()
    alias, _ = service.get_or_create_user("email", "zelda@example.org", display_name=NAME)
    service.set_fact("email_signature", f"{NAME}, {SECRET}", scope="user", user_id=alias.pk)
    schedule_reminder(user_id=alias.pk, when="in 2 hours", message=f"tell {NAME} the code {SECRET}")
    service.merge_users(alias.pk, user_id)
    return {"id": user_id, "alias": alias.pk, "thread": result.thread_id}


def verify(person):
    args = [
        NAME,
        "chat:zq",
        "zelda@example.org",
        "--user-id",
        str(person["id"]),
        "--user-id",
        str(person["alias"]),
        "--text",
        SECRET,
        "--text",
        "Quartermain",
    ]
    out = io.StringIO()
    call_command("memory", "verify-erasure", *args, stdout=out)
    return out.getvalue()


def sqlite_files():
    db = Path(connection.settings_dict["NAME"])
    return [p for p in (db, Path(f"{db}-wal"), checkpoint_path(), Path(f"{checkpoint_path()}-wal")) if p.exists()]


def test_forget_a_person_leaves_no_trace(person, admin_client):
    with pytest.raises(CommandError):  # before: the scan finds them everywhere
        verify(person)
    response = admin_client.post(
        "/api/v1/memory-users/batch-delete/", {"ids": [person["id"]], "cascade": True}, content_type="application/json"
    )
    assert response.status_code == 200, response.content
    cascaded = response.json()["cascaded"]
    assert cascaded["threads"] == 1 and cascaded["checkpoints"] >= 3 and cascaded["recall_events"] >= 1
    assert cascaded["merged_users"] == 1 and cascaded["facts"] >= 3 and cascaded["episodes"] == 3
    assert verify(person).startswith("0 traces")
    if connection.vendor == "sqlite":
        needles = [STEM.decode(), SECRET, "zelda@example.org"]
        for path, counts in count_in_files(sqlite_files(), needles).items():
            assert not any(counts.values()), (path, counts)
    [record] = DeletionRecord.objects.all()
    assert record.actor == "api:admin" and record.kind == "memory users" and record.ids == [person["id"]]
    assert (
        "quartermain" not in json.dumps({"ids": record.ids, "cascaded": record.cascaded, "actor": record.actor}).lower()
    )


def test_verify_erasure_finds_a_planted_trace(person, service):
    service.delete_users([person["id"]], cascade=True)
    assert verify(person).startswith("0 traces")
    Fact.objects.create(key="note", value=f"about {NAME}", scope="global", search_text="note")
    with pytest.raises(CommandError) as failed:
        verify(person)
    assert failed.value.returncode == 1


def test_verify_erasure_leaves_this_processs_sqlite_connections_their_locks(person):
    """Reading the database file's bytes in this process would drop its SQLite locks (they are POSIX
    locks of the process): another process closing its connection would then delete the WAL under ours."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite files only")
    with pytest.raises(CommandError):
        verify(person)
    database = connection.settings_dict["NAME"]
    wal = Path(f"{database}-wal")
    assert wal.exists()
    other = "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('SELECT 1 FROM sqlite_master'); c.close()"
    subprocess.run([sys.executable, "-c", other, database], check=True)
    assert wal.exists(), "another process took this one's open connections for gone"
    assert Fact.objects.filter(user_id=person["id"]).exists()


def test_an_erasure_whose_wal_a_reader_holds_says_so(person, service, caplog, settings):
    """A reader of older frames keeps the WAL from being truncated after the commit: that is logged,
    not passed over in silence (the words may still be in the -wal file)."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite files only")
    settings.MEMORY = {**settings.MEMORY, "ERASURE_WAL_WAIT_SECONDS": 0.5}  # retried this long, then reported
    reader = sqlite3.connect(connection.settings_dict["NAME"])
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM memory_fact").fetchone()  # a snapshot from before the delete
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout = 200")  # the checkpoint waits this long for the reader
    try:
        with caplog.at_level(logging.WARNING, logger="memory.erasure"):
            service.delete_users([person["id"]], cascade=True)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA busy_timeout = 30000")
        reader.rollback()
        reader.close()
    assert "a reader kept the database's WAL" in caplog.text
    assert not MemoryUser.objects.filter(pk=person["id"]).exists()  # the deletion stands


def test_an_erasure_whose_checkpoint_wal_a_reader_holds_says_so(person, service, caplog, settings):
    """The same for the SQLite checkpoint store: a reader of its older frames is logged, not ignored."""
    from workflows.conversations.checkpointer import checkpointer_kind, get_checkpointer

    if checkpointer_kind() != "sqlite":
        pytest.skip("SQLite checkpoints only")
    settings.MEMORY = {**settings.MEMORY, "ERASURE_WAL_WAIT_SECONDS": 0.5}
    saver = get_checkpointer()
    reader = sqlite3.connect(checkpoint_path())
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM checkpoints").fetchone()  # a snapshot from before the delete
    with saver.lock:
        saver.conn.execute("PRAGMA busy_timeout = 200")
    try:
        with caplog.at_level(logging.WARNING, logger="engram.workflows"):
            service.delete_users([person["id"]], cascade=True)
    finally:
        with saver.lock:
            saver.conn.execute("PRAGMA busy_timeout = 30000")
        reader.rollback()
        reader.close()
    assert "a reader kept the checkpoint store's WAL" in caplog.text


def test_deleting_a_person_in_the_admin_keeps_their_name_out_of_the_admin_log(person, admin_client):
    from django.contrib.admin.models import LogEntry

    change = f"/memories/memory/memoryuser/{person['id']}/change/"
    assert admin_client.post(
        change, {"display_name": NAME + " II", "identities-TOTAL_FORMS": "0", "identities-INITIAL_FORMS": "0"}
    ).status_code in (200, 302)
    assert not LogEntry.objects.filter(object_repr__icontains="quartermain").exists()
    delete = f"/memories/memory/memoryuser/{person['id']}/delete/"
    assert admin_client.post(delete, {"post": "yes"}).status_code == 302
    assert not MemoryUser.objects.filter(pk=person["id"]).exists()
    assert not LogEntry.objects.filter(object_repr__icontains="quartermain").exists()
    assert DeletionRecord.objects.get().actor == "admin:admin"


def test_export_person_holds_everything_about_them(person):
    out = io.StringIO()
    call_command("memory", "export-person", "chat:zq", stdout=out)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    kinds = {row["kind"] for row in rows}
    assert {"memory_user", "identity", "fact", "episode", "recall_event", "thread", "reminder"} <= kinds
    [reminder] = [row for row in rows if row["kind"] == "reminder"]  # the alias's, moved with the merge
    assert SECRET in reminder["message"] and reminder["status"] == "pending"
    assert sum(row["kind"] == "memory_user" for row in rows) == 2  # the person and the merged alias
    [thread] = [row for row in rows if row["kind"] == "thread"]
    assert any(SECRET in m["content"] for m in thread["messages"])
    assert {row["external_id"] for row in rows if row["kind"] == "identity"} == {"zq", "zelda@example.org"}
