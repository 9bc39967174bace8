"""Forgetting a person holds against their work in flight elsewhere (another server, another process).

Real threads on real connections of one database stand for the other servers: turns of a graph on the
shared checkpointer, recalls and fact writes for the person run while the forget commits. The forget
never fails with a database error (a conflict is tried again, then answered 409 with nothing deleted);
once it has committed nothing more is written under the person (checkpoints, recall events, runs), and
recalls for their id answer not-found (404 over REST, an error result over MCP) and log nothing.
"""

import logging
import threading
import time
from types import SimpleNamespace

import pytest
from django.db import IntegrityError, connection, transaction
from langchain_core.messages import AIMessage
from langgraph.graph import START, MessagesState, StateGraph

from memory.exceptions import InvalidMemoryArgument, MemoryConflict, MemoryNotFound, PersonForgotten
from memory.mcp_server import Caller
from memory.models import ChannelIdentity, Fact, MemoryUser, RecallEvent
from memory.operations.erasure import find_traces
from memory.signals import users_deleting
from workflows.conversations.checkpointer import get_checkpointer
from workflows.graph.runs import finish_run, start_run
from workflows.langgraph import conversation
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "otherserver-pin-7731"


def _graph():
    graph = StateGraph(MessagesState)
    graph.add_node("echo", lambda state: {"messages": [AIMessage(content="noted")]})
    graph.add_edge(START, "echo")
    return graph.compile(checkpointer=get_checkpointer())


def _threads_of(user_id):
    return sorted(
        {
            c.config["configurable"]["thread_id"]
            for c in get_checkpointer().list(None)
            if c.config["configurable"]["thread_id"].startswith(f"{user_id}:")
        }
    )


def test_forget_during_concurrent_turns_and_recalls_leaves_no_trace(service):
    person, _ = service.get_or_create_user("chat", "busy-person", display_name="Busy Person")
    service.set_fact("pin", SECRET, scope="user", user_id=person.pk)
    graph, stop, surprises, turns = _graph(), threading.Event(), [], []

    def worker(n):
        # Another server's request threads: turns on new and continued conversations, recalls, writes.
        try:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    with conversation("busy-graph", user_id=person.pk, conversation_id=f"c{n}-{i % 3}") as config:
                        graph.invoke({"messages": [("user", f"my pin is {SECRET} ({n}.{i})")]}, config)
                    service.recall(f"pin {SECRET}", user_id=person.pk)
                    service.set_fact(f"note{n}", f"{SECRET} {i}", scope="user", user_id=person.pk)
                    service.flush_recall_log()
                    turns.append(n)
                except (MemoryNotFound, InvalidMemoryArgument):  # a fact write refused names the user
                    return  # the person is gone: this server stops writing for them
        except Exception as exc:  # noqa: BLE001  (the test reports it)
            surprises.append(repr(exc))
        finally:
            connection.close()

    workers = [threading.Thread(target=worker, args=(n,)) for n in range(3)]
    for w in workers:
        w.start()
    deadline = time.monotonic() + 30
    while len(turns) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    result = service.delete_users([person.pk], cascade=True)  # never a database error
    stop.set()
    for w in workers:
        w.join(60)
    assert not any(w.is_alive() for w in workers)
    assert surprises == []
    assert result.deleted == 1
    service.flush_recall_log()
    assert not MemoryUser.objects.filter(pk=person.pk).exists()
    assert not RecallEvent.objects.filter(user_id=person.pk).exists()
    assert _threads_of(person.pk) == []
    assert find_traces([SECRET, "Busy Person"], [person.pk]) == []


@pytest.fixture
def conflicting_forget():
    """Each forget try meets a real constraint violation in its transaction (as a row another server
    inserted meanwhile does) while `fails["left"]` > 0."""
    fails = {"left": 0}

    def collide(sender, user_ids, **kwargs):
        if fails["left"] > 0:
            fails["left"] -= 1
            ident = ChannelIdentity.objects.filter(user_id__in=list(user_ids)).first()
            ChannelIdentity.objects.create(user_id=ident.user_id, channel=ident.channel, external_id=ident.external_id)

    users_deleting.connect(collide, dispatch_uid="test_conflicting_forget")
    yield fails
    users_deleting.disconnect(dispatch_uid="test_conflicting_forget")


def test_a_conflicting_forget_is_tried_again(service, conflicting_forget):
    person, _ = service.get_or_create_user("chat", "retried", display_name="Retried")
    conflicting_forget["left"] = 2
    result = service.delete_users([person.pk], cascade=True)
    assert result.deleted == 1 and conflicting_forget["left"] == 0
    assert not MemoryUser.objects.filter(pk=person.pk).exists()


def test_a_forget_that_keeps_conflicting_answers_409_and_deletes_nothing(service, conflicting_forget, staff_client):
    person, _ = service.get_or_create_user("chat", "stuck", display_name="Stuck")
    service.set_fact("pin", SECRET, scope="user", user_id=person.pk)
    conflicting_forget["left"] = 100
    with pytest.raises(MemoryConflict) as raised:
        service.delete_users([person.pk], cascade=True)
    assert raised.value.field == "ids" and "nothing was deleted" in raised.value.message
    assert isinstance(raised.value.__cause__, IntegrityError)
    response = staff_client.post(
        "/api/v1/memory-users/batch-delete/", {"ids": [person.pk], "cascade": True}, content_type="application/json"
    )
    assert response.status_code == 409, response.content
    assert "nothing was deleted" in response.json()["ids"][0]
    assert MemoryUser.objects.filter(pk=person.pk).exists()
    assert Fact.objects.filter(user_id=person.pk, value=SECRET).exists()


def test_checkpoint_writes_after_the_forget_are_refused_and_earlier_ones_purged(service):
    person, _ = service.get_or_create_user("chat", "saver", display_name="Saver")
    graph = _graph()
    untracked = {"configurable": {"thread_id": f"{person.pk}:direct:graph:elsewhere"}}
    # A first turn on another server wrote its checkpoints; its thread is not tracked yet.
    graph.invoke({"messages": [("user", f"my pin is {SECRET}")]}, untracked)
    assert _threads_of(person.pk) == [untracked["configurable"]["thread_id"]]
    service.delete_users([person.pk], cascade=True)
    assert _threads_of(person.pk) == []  # purged by the forget, tracked or not
    with pytest.raises(PersonForgotten):  # that server's next step writes nothing
        graph.invoke({"messages": [("user", f"again {SECRET}")]}, untracked)
    assert _threads_of(person.pk) == []
    assert find_traces([SECRET], [person.pk]) == []
    # Threads of no person (not an Engram thread id) are written as before.
    graph.invoke({"messages": [("user", "hello")]}, {"configurable": {"thread_id": "free-form"}})
    assert get_checkpointer().get_tuple({"configurable": {"thread_id": "free-form"}}) is not None


def test_a_run_finishing_after_its_person_was_forgotten_is_not_kept(service, demo_workflow):
    person, _ = service.get_or_create_user("telegram", "4242", display_name="Runner")
    info = SimpleNamespace(type="telegram", channel="telegram", external_id="4242")
    run = start_run(demo_workflow, info, {"payload": {"text": f"my pin is {SECRET}"}})
    service.delete_users([person.pk], cascade=True)  # on server A, while the run goes on on B
    finish_run(
        run,
        state={"user": {"id": person.pk}, "reply": f"noted {SECRET}"},
        events=[],
        errors=[],
        status="completed",
        duration_ms=1.0,
    )
    assert not WorkflowRun.objects.filter(pk=run.pk).exists()
    assert find_traces([SECRET, "4242"], [person.pk]) == []


def test_a_channels_finish_runs_with_the_runs_record_and_knows_whether_the_person_was_kept(service, demo_workflow):
    """finish_run's `then` (a Telegram update's finish and reply): one transaction with the record,
    told whether the person is still there; if it fails, the run is recorded all the same."""
    kept, gone = (service.get_or_create_user("telegram", n, display_name=n)[0] for n in ("4343", "4444"))
    info = SimpleNamespace(type="telegram", channel="telegram", external_id="4343")
    finished = {"user": {"id": kept.pk}, "reply": "noted"}
    seen = []
    run = start_run(demo_workflow, info, {"payload": {"text": "hello"}})
    answer = finish_run(
        run,
        state=finished,
        events=[],
        errors=[],
        status="succeeded",
        duration_ms=1.0,
        then=lambda k: seen.append(k) or 7,
    )
    assert answer == 7 and seen == [True]
    assert WorkflowRun.objects.get(pk=run.pk).reply == "noted"

    run = start_run(demo_workflow, info, {"payload": {"text": f"my pin is {SECRET}"}})
    service.delete_users([gone.pk], cascade=True)
    state = {"user": {"id": gone.pk}, "reply": f"noted {SECRET}"}
    finish_run(run, state=state, events=[], errors=[], status="succeeded", duration_ms=1.0, then=seen.append)
    assert seen == [True, False]
    assert not WorkflowRun.objects.filter(pk=run.pk).exists()

    def outbox_down(person_kept):
        raise IntegrityError("the reply could not be queued")

    run = start_run(demo_workflow, info, {"payload": {"text": "hello"}})
    with pytest.raises(IntegrityError):
        finish_run(run, state=finished, events=[], errors=[], status="succeeded", duration_ms=1.0, then=outbox_down)
    recorded = WorkflowRun.objects.get(pk=run.pk)
    assert (recorded.reply, recorded.status) == ("noted", "succeeded") and recorded.finished_at is not None


def test_recall_for_a_forgotten_user_is_not_found_everywhere_and_logs_nothing(service, staff_client):
    person, _ = service.get_or_create_user("chat", "gone", display_name="Gone")
    service.set_fact("colour", "vermilion", scope="user", user_id=person.pk)
    service.delete_users([person.pk], cascade=True)
    with pytest.raises(MemoryNotFound):
        service.recall("vermilion colour", user_id=person.pk)
    response = staff_client.get("/api/v1/recall/", {"q": "vermilion", "user": person.pk})
    assert response.status_code == 404, response.content
    response = staff_client.get("/api/v1/recall/", {"q": "vermilion", "user": 987654})  # never there
    assert response.status_code == 404

    from test_mcp import tools_for

    async def work(call):
        return await call("recall", query="vermilion colour")

    error, text = tools_for(Caller("desk", person.pk), work)
    assert error and "does not exist" in text
    service.flush_recall_log()
    assert not RecallEvent.objects.filter(user_id=person.pk).exists()
    assert not RecallEvent.objects.filter(user_id=987654).exists()


def test_a_reply_of_a_person_forgotten_mid_run_is_not_queued(service, demo_workflow):
    from workflows.channels.claims import claim_update
    from workflows.channels.outbox import queue_reply
    from workflows.models import TelegramReply

    person, _ = service.get_or_create_user("telegram", "5151", display_name="Replied")
    claim = claim_update(demo_workflow, 5151001)
    service.delete_users([person.pk], cascade=True)  # on server A, while B's run for them finishes
    with transaction.atomic():  # the transaction that records the run as finished
        assert queue_reply(claim.row, claim.token, user_id=person.pk, chat_id="5151", text=f"noted {SECRET}") is None
    assert not TelegramReply.objects.exists()
    assert find_traces([SECRET, "5151"], [person.pk]) == []


def test_a_forget_that_deadlocks_with_a_writer_is_tried_again(service, caplog):
    """PostgreSQL: another server holds one of the person's facts and then asks for the person's lock,
    while the forget holds the person and waits for the fact: a real deadlock. Whichever side the
    database aborts, the forget succeeds (tried again if it was the one), never a database error."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has one writer at a time: no deadlock between two")
    person, _ = service.get_or_create_user("chat", "deadlocked", display_name="Deadlocked")
    fact = service.set_fact("pin", SECRET, scope="user", user_id=person.pk).fact
    holding, outcome = threading.Event(), {}

    def other_server():
        try:
            with transaction.atomic():
                list(Fact.objects.select_for_update().filter(pk=fact.pk))
                holding.set()
                time.sleep(0.5)  # the forget now holds the person and waits for this fact
                service.hold_person(person.pk)
            outcome["writer"] = "kept"
        except Exception as exc:  # noqa: BLE001  (the victim of the deadlock, or the person gone)
            outcome["writer"] = type(exc).__name__
        finally:
            connection.close()

    worker = threading.Thread(target=other_server)
    worker.start()
    assert holding.wait(30)
    with caplog.at_level(logging.WARNING, logger="engram.memory"):
        result = service.delete_users([person.pk], cascade=True)
    worker.join(60)
    assert result.deleted == 1
    # The deadlock happened: the database aborted the writer, or the forget, which was tried again.
    forget_retried = "deadlock detected" in caplog.text and "try 1 of 4 met a conflict" in caplog.text
    assert outcome["writer"] == "OperationalError" or forget_retried, (outcome, caplog.text)
    assert not MemoryUser.objects.filter(pk=person.pk).exists()
    assert find_traces([SECRET], [person.pk]) == []
