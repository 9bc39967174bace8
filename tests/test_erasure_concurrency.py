"""Forget and a concurrent write for the same person serialise: no orphan checkpoint, no event after the commit.

Real threads on one database: a turn of a graph on the shared checkpointer (workflows.langgraph.conversation)
writes the person's words, and the forget commits either after the checkpoint was written or while the
turn's tracking waits for the person's lock. Either way the turn's checkpoints go, no Thread row is made,
the refusal is logged and raised, and verify-erasure finds nothing.
"""

import logging
import threading
import time

import pytest
from django.db import connection
from langchain_core.messages import AIMessage
from langgraph.graph import START, MessagesState, StateGraph

from memory.exceptions import PersonForgotten
from memory.models import RecallEvent
from memory.operations.erasure import find_traces
from memory.recall.events import recall_log
from memory.signals import users_deleting
from workflows.conversations.checkpointer import get_checkpointer
from workflows.langgraph import conversation
from workflows.models import Thread

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "race-pin-5521"


def _graph():
    graph = StateGraph(MessagesState)
    graph.add_node("echo", lambda state: {"messages": [AIMessage(content="noted")]})
    graph.add_edge(START, "echo")
    return graph.compile(checkpointer=get_checkpointer())


def _kept_threads(user_id):
    return [
        c.config["configurable"]["thread_id"]
        for c in get_checkpointer().list(None)
        if c.config["configurable"]["thread_id"].startswith(f"{user_id}:")
    ]


@pytest.mark.parametrize("when", ["after the checkpoint", "during the tracking"])
def test_a_turn_racing_the_forget_keeps_nothing(service, when, caplog):
    person, _ = service.get_or_create_user("chat", "racer", display_name="Racer")
    graph = _graph()
    written, proceed, outcome = threading.Event(), threading.Event(), {}

    def turn():
        try:
            with conversation("race-graph", user_id=person.pk) as config:
                graph.invoke({"messages": [("user", f"my pin is {SECRET}")]}, config)
                written.set()
                assert proceed.wait(30)
        except Exception as exc:  # noqa: BLE001  (the test inspects it)
            outcome["error"] = exc
        finally:
            connection.close()

    def hold_forget_open(sender, user_ids, **kwargs):
        proceed.set()  # the turn now tracks its thread while this forget has not committed
        time.sleep(0.5)

    if when == "during the tracking":
        users_deleting.connect(hold_forget_open, dispatch_uid="test_hold_forget_open")
    worker = threading.Thread(target=turn)
    try:
        with caplog.at_level(logging.WARNING, logger="engram.workflows"):
            worker.start()
            assert written.wait(30)
            result = service.delete_users([person.pk], cascade=True)
            proceed.set()
            worker.join(30)
    finally:
        users_deleting.disconnect(dispatch_uid="test_hold_forget_open")
    assert not worker.is_alive()
    assert isinstance(outcome.get("error"), PersonForgotten), outcome
    assert result.erasure.complete, result.erasure
    assert not Thread.objects.filter(user_id=person.pk).exists()
    assert _kept_threads(person.pk) == []
    assert "was forgotten while the turn ran" in caplog.text
    assert "FOREIGN KEY" not in caplog.text
    assert find_traces([SECRET], [person.pk]) == []


def test_recall_events_noted_during_the_forget_are_never_written(service):
    """A recall for the person while their forget runs (PostgreSQL: it still sees them and notes events;
    SQLite: it waits for the forget's write lock): after the forget, no event is stored under their id."""
    person, _ = service.get_or_create_user("chat", "recalled", display_name="Recalled")
    service.set_fact("colour", "ultramarine", scope="user", user_id=person.pk)
    found, workers = {}, []

    def recall():
        try:
            found["hits"] = len(service.recall("ultramarine colour", user_id=person.pk).hits)
        finally:
            connection.close()

    def recall_meanwhile(sender, user_ids, **kwargs):
        worker = threading.Thread(target=recall)
        workers.append(worker)
        worker.start()
        worker.join(2)  # PostgreSQL: done inside the forget; SQLite: still waiting for its write lock

    users_deleting.connect(recall_meanwhile, dispatch_uid="test_recall_meanwhile")
    try:
        service.delete_users([person.pk], cascade=True)
    finally:
        users_deleting.disconnect(dispatch_uid="test_recall_meanwhile")
    workers[0].join(60)
    if connection.vendor == "postgresql":
        assert found["hits"] >= 1  # the race really happened: it read the person before the commit
    service.flush_recall_log()
    assert not RecallEvent.objects.filter(user_id=person.pk).exists()


def test_events_another_process_noted_before_the_forget_are_dropped_when_written(service, caplog):
    """A process that did not run the forget still holds the person's events in its buffer: they are
    dropped under the person lock when written, not stored under the deleted id."""
    person, _ = service.get_or_create_user("chat", "elsewhere", display_name="Elsewhere")
    bystander, _ = service.get_or_create_user("chat", "stays", display_name="Stays")
    service.delete_users([person.pk], cascade=True)
    events = [
        RecallEvent(created_at=None, user_id=uid, query="q", kind="fact", item_id=1, rank=1, score=1.0, mode="k")
        for uid in (person.pk, bystander.pk)
    ]
    from django.utils import timezone

    for event in events:
        event.created_at = timezone.now()
    recall_log.record(events, [], timezone.now())
    with caplog.at_level(logging.WARNING, logger="engram.memory"):
        service.flush_recall_log()
    assert list(RecallEvent.objects.values_list("user_id", flat=True)) == [bystander.pk]
    assert "dropped 1 recall event(s) of forgotten people" in caplog.text
