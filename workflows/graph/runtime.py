"""Running workflows: compile (once per definition version), build the first state, stream the run
through LangGraph and keep its record."""

import collections
import contextvars
import functools
import logging
import threading
import time
from dataclasses import dataclass, field

from django.utils import timezone
from langchain_core.messages import HumanMessage

from memory.models import enter_workspace

from ..conf import on_workflow_settings_changed
from ..conversations import upkeep
from ..exceptions import WorkflowError
from ..language.definition import compile_definition, validate_definition
from ..models import RunStatus, Workflow
from . import runs
from .triggers import TriggerInfo, parse_trigger

_lock = threading.Lock()
_compiled = {}

RUN_RECURSION_LIMIT = 50

logger = logging.getLogger("engram.workflows")


class WorkflowNotFound(WorkflowError, LookupError):
    def __init__(self, slug):
        self.slug = slug
        super().__init__(f"no active workflow {slug!r}")


@dataclass
class RunResult:
    """What a run produced, for the trigger that started it."""

    workflow: str
    trigger: TriggerInfo
    reply: str
    user: dict | None
    thread_id: str
    episode_id: int | None
    remembered: list = field(default_factory=list)
    memory_errors: list = field(default_factory=list)
    state: dict = field(default_factory=dict, repr=False)
    run_id: int | None = None

    @property
    def ok(self):
        return not self.memory_errors

    def as_dict(self):
        return {
            "workflow": self.workflow,
            "reply": self.reply,
            "user": self.user,
            "thread_id": self.thread_id,
            "episode_id": self.episode_id,
            "remembered": self.remembered,
            "memory_errors": self.memory_errors,
            "run_id": self.run_id,
        }


def get_workflow(slug):
    """The active workflow `slug` (a queryset: one indexed lookup is a negligible part of a run, so
    hand-written SQL would buy nothing)."""
    found = Workflow.objects.filter(slug=slug, is_active=True).first()
    if found is None:
        raise WorkflowNotFound(slug)
    return found


def compiled_graph(workflow):
    """The compiled graph of a workflow, rebuilt when the workflow was saved since."""
    key = (workflow.pk, workflow.updated_at)
    graph = _compiled.get(key)
    if graph is None:
        with _lock:
            graph = _compiled.get(key)
            if graph is None:
                definition = validate_definition(workflow.definition)
                graph = compile_definition(definition, workflow_id=workflow.pk, workflow_slug=workflow.slug)
                for old in [k for k in _compiled if k[0] == workflow.pk]:
                    del _compiled[old]
                _compiled[key] = graph
    return graph


def clear_compiled():
    with _lock:
        _compiled.clear()


def run_workflow(workflow, trigger, *, on_finish=None) -> RunResult:
    """Run `workflow` for `trigger` ({"type", "payload"}) and keep the run's record. A bad trigger raises
    InvalidTrigger before anything runs; a node's exception is recorded on the run, then raised.

    `on_finish(result, person_kept)`: called when the run succeeded, inside the transaction that
    writes its record (runs.finish_run's `then`), so a channel records its side of the finish with it.
    """
    stream = RunStream(workflow, trigger, on_finish=on_finish)
    for _ in stream:
        pass
    if stream.error is not None:
        raise stream.error
    return stream.result


class RunStream:
    """One run as the events of LangGraph's own stream (`stream_mode=["tasks", "values"]`): iterate it
    to run the workflow; each event comes as the graph produces it. It is the only way a workflow runs:
    `run_workflow` drains it, the builder's streaming endpoint sends it as server-sent events.

    Events (workflows.graph.runs.EventType): run_started, then node_started (the state the node reads) and
    node_finished (its update, its duration, what it found in or wrote to memory) or node_error per
    node, then run_finished (status, reply, errors, duration). The run's record (WorkflowRun) is
    created when the stream is, and written with every event once the run ends.

    After iterating: `result` (a RunResult, None if a node raised) and `error` (that exception).
    A client that stops reading (closes the iterator) does not stop the run: it completes and is recorded.
    """

    def __init__(self, workflow, trigger, *, on_finish=None):
        self.info = parse_trigger(trigger)  # InvalidTrigger before anything runs or is recorded
        self.workflow, self.trigger = workflow, trigger
        self.graph = compiled_graph(workflow)
        # The run works in its workflow's workspace: every step runs in this context (LangGraph's
        # tasks copy it), so the workspace is current for the run and never outside it.
        self.context = contextvars.copy_context()
        self.context.run(enter_workspace, workflow.workspace_id)
        self.record = self.context.run(runs.start_run, workflow, self.info, trigger)
        self.result, self.error = None, None
        self.events = []
        self.on_finish = on_finish

    @property
    def run_id(self):
        return self.record.pk

    def __iter__(self):
        steps = self._steps()
        try:
            while True:
                try:
                    event = self.context.run(next, steps)
                except StopIteration:
                    return
                yield event
        except GeneratorExit:
            # the client left: the run still completes, and its record is written
            self.context.run(collections.deque, steps, 0)
            raise

    def _emit(self, kind, data):
        event = runs.Event(kind, runs.jsonable(data))
        self.events.append(event)
        return event

    def _steps(self):
        started, started_at = time.monotonic(), timezone.now()
        yield self._emit(
            runs.EventType.RUN_STARTED,
            {"run_id": self.run_id, "workflow_version": self.record.workflow_version, "started_at": started_at},
        )
        state, task_started, failure = {}, {}, None
        initial = {
            "trigger": self.trigger,
            "workflow": {"id": self.workflow.pk, "slug": self.workflow.slug},
            "run_started_at": started_at.isoformat(),
            "messages": [HumanMessage(content=self.info.text)],
            "memory_errors": [],
            "actions": [],
            "facts_to_remember": [],
        }
        try:
            for mode, chunk in self.graph.stream(
                initial, {"recursion_limit": RUN_RECURSION_LIMIT}, stream_mode=["tasks", "values"]
            ):
                if mode == "values":
                    state = chunk
                elif "input" in chunk:  # a task starts
                    task_started[chunk["id"]] = time.monotonic()
                    yield self._emit(runs.EventType.NODE_STARTED, {"node": chunk["name"], "input": chunk["input"]})
                else:  # a task ends
                    took = (time.monotonic() - task_started.pop(chunk["id"], started)) * 1000
                    if chunk.get("error") is not None:
                        failure = failure or chunk["error"]
                        yield self._emit(
                            runs.EventType.NODE_ERROR, {"node": chunk["name"], "error": _describe(chunk["error"])}
                        )
                        continue
                    yield self._emit(
                        runs.EventType.NODE_FINISHED,
                        {
                            "node": chunk["name"],
                            "output": chunk.get("result"),
                            "duration_ms": round(took, 3),
                            "memory": runs.node_memory(chunk.get("result")),
                        },
                    )
        except Exception as exc:  # noqa: BLE001  (any node's failure ends the run: recorded, reported, re-raised by run_workflow)
            logger.exception("workflow %s: run %s failed", self.workflow.slug, self.run_id)
            failure = exc
        errors = list(state.get("memory_errors") or [])
        if failure is None:
            # Upkeep after the answer: procedure outcomes, thread trimming, consolidation; never raises.
            upkeep_errors = upkeep.after_run(state)
            if upkeep_errors:
                state["memory_errors"] = errors = [*errors, *upkeep_errors]
        else:
            self.error = failure
            errors.append({"node": None, "operation": "run", "error": _describe(failure)})
        status = RunStatus.SUCCEEDED if failure is None and not errors else RunStatus.FAILED
        duration_ms = (time.monotonic() - started) * 1000
        finished = self._emit(
            runs.EventType.RUN_FINISHED,
            {
                "run_id": self.run_id,
                "status": status,
                "reply": state.get("reply", ""),
                "errors": errors,
                "duration_ms": round(duration_ms, 3),
            },
        )
        result = None
        if failure is None:
            result = RunResult(
                workflow=self.workflow.slug,
                trigger=self.info,
                reply=state.get("reply", ""),
                user=state.get("user"),
                thread_id=state.get("thread_id", ""),
                episode_id=state.get("episode_id"),
                remembered=state.get("remembered", []),
                memory_errors=state.get("memory_errors", []),
                state=state,
                run_id=self.run_id,
            )
        then = None
        if result is not None and self.on_finish is not None:
            then = functools.partial(self.on_finish, result)
        runs.finish_run(
            self.record,
            state=state,
            events=self.events,
            errors=errors,
            status=status,
            duration_ms=duration_ms,
            then=then,
        )
        self.result = result
        yield finished


def _describe(exc):
    return f"{type(exc).__name__}: {exc}"


on_workflow_settings_changed(clear_compiled)
