"""The visual builder's backend: runs streamed as server-sent events, run records, the memory a run
will see, and the built frontend served at /builder/.

The stream is LangGraph's own (workflows.graph.runtime.RunStream) sent as it comes: under WSGI (gunicorn's
threads, Django's test server) the response iterates it on the request's thread; under ASGI (uvicorn)
the run goes on a worker thread that hands each event to the event loop, so no event waits for the
run to end. Nothing between buffers it: no GZip middleware, `Cache-Control: no-cache` and
`X-Accel-Buffering: no` (nginx).
"""

import asyncio
import json
from pathlib import Path

import django_filters
from django.contrib.auth.views import redirect_to_login
from django.contrib.staticfiles import finders
from django.core.handlers.asgi import ASGIRequest
from django.db import transaction
from django.http import HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.middleware.csrf import get_token
from django.templatetags.static import static
from django.urls import reverse
from django.utils.html import escape
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field, extend_schema_view
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.response import Response

from memory.api.filters import IdFilter
from memory.api.policy import StaffAPI
from memory.api.serializers import BatchDeleteResultSerializer, BatchDeleteSerializer
from memory.asynchronous import off_the_loop
from memory.exceptions import InvalidMemoryArgument
from memory.service import MemoryService

from ..conf import workflow_settings
from ..conversations.threads import thread_id_for
from ..exceptions import InvalidTrigger
from ..graph.runs import EventType, admin_url, delete_runs
from ..graph.runtime import RunStream
from ..graph.triggers import DIRECT
from ..models import RunStatus, WorkflowRun
from .serializers import StrictCharField

BUILD_DIR = "workflows/builder"  # inside the app's static files; the frontend's build writes there
RECENT_EPISODES = 5

# ------------------------------------------------------------------ streaming a run


class JSONOnly(BaseContentNegotiation):
    """The stream endpoint answers errors in JSON whatever Accept says (a client asks for text/event-stream)."""

    def select_parser(self, request, parsers):
        return parsers[0]

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "minLength": 1, "maxLength": 255, "pattern": r"\S"},
            {"type": "integer"},
        ],
        "description": "The sender's id on that channel: a string or an integer (a Telegram user id is a number).",
    }
)
class ExternalIdField(serializers.Field):
    """A person's id on their channel: a JSON string or integer (a Telegram user id is a number)."""

    default_error_messages = {"invalid": "Must be a string or an integer.", "blank": "May not be blank."}

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (str, int)):
            self.fail("invalid")
        text = str(data)
        # The length is the one sent, as the schema's maxLength counts it (surrounding spaces included).
        if len(text) > 255:
            raise serializers.ValidationError("Ensure this field has no more than 255 characters.")
        text = text.strip()
        if not text:
            self.fail("blank")
        return text

    def to_representation(self, value):
        return value


class StreamRunSerializer(serializers.Serializer):
    """Who sends what: the run panel's message and sender, so identify_user has someone to identify."""

    message = StrictCharField(help_text="What the person says.")
    channel = StrictCharField(max_length=50, help_text="The sender's channel: telegram, email, chat, ...")
    external_id = ExternalIdField()
    display_name = StrictCharField(required=False, allow_blank=True, max_length=200)
    conversation_id = StrictCharField(
        required=False, allow_blank=True, max_length=100, help_text=f"A group chat's id; default {DIRECT!r}."
    )

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({unknown[0]: ["Unknown field."]})
        return super().to_internal_value(data)

    def trigger(self):
        data = self.validated_data
        payload = {"message": data["message"], "channel": data["channel"], "user_id": data["external_id"]}
        for name in ("display_name", "conversation_id"):
            if data.get(name):
                payload[name] = data[name]
        return {"type": "manual", "payload": payload}


# The trigger's names for the fields of this body.
_TRIGGER_FIELDS = {"user_id": "external_id", "payload": "message"}


def start_stream(request, workflow):
    """The run's event stream as a response, or a ValidationError before anything ran."""
    body = StreamRunSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    try:
        stream = RunStream(workflow, body.trigger())
    except InvalidTrigger as exc:
        raise serializers.ValidationError({_TRIGGER_FIELDS.get(exc.field, exc.field): [exc.message]}) from None
    if isinstance(request._request, ASGIRequest):
        content = _events_off_the_loop(stream)
    else:
        content = (_sse(event) for event in stream)
    response = StreamingHttpResponse(content, content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def _sse(event):
    return f"event: {event.type}\ndata: {json.dumps(event.data, ensure_ascii=False)}\n\n".encode()


async def _events_off_the_loop(stream):
    """The stream run on a worker thread, its events passed to the loop one by one as they come."""
    loop = asyncio.get_running_loop()
    queue, done = asyncio.Queue(), object()

    def produce():
        try:
            for event in stream:
                loop.call_soon_threadsafe(queue.put_nowait, event)
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, done)

    worker = asyncio.ensure_future(off_the_loop(produce)())
    try:
        while (event := await queue.get()) is not done:
            yield _sse(event)
        await worker  # a failure to write the record surfaces here (the events went out first)
    finally:
        if not worker.done():  # the client left: the run completes on its thread and is recorded
            worker.add_done_callback(lambda task: task.cancelled() or task.exception())


# ------------------------------------------------------------------ the memory a run will see


class MemoryViewQuerySerializer(serializers.Serializer):
    channel = serializers.CharField(max_length=50)
    external_id = serializers.CharField(max_length=255)
    conversation_id = serializers.CharField(max_length=100, required=False, default=DIRECT)
    message = serializers.CharField(
        max_length=4000, required=False, help_text="Procedures matching this message (else every active one)."
    )


def memory_view(workflow, query):
    """The person's memory as the workflow's next run sees it: facts by the scope that wins for each
    key, recent episodes with them, and procedures. Read through MemoryService; nothing is created."""
    service = MemoryService()
    try:
        user = service.find_user(query["channel"], query["external_id"])
    except InvalidMemoryArgument as exc:
        raise serializers.ValidationError({exc.field: [exc.message]}) from None
    user_id = user.pk if user is not None else None
    session_id = thread_id_for(user_id, query["conversation_id"], workflow.pk) if user is not None else ""
    facts = {"session": [], "user": [], "agent": [], "global": []}
    for fact in service.list_facts(agent_id=workflow.slug, user_id=user_id, session_id=session_id):
        facts[fact.scope].append(
            {
                "id": fact.pk,
                "key": fact.key,
                "value": fact.value,
                "fact_type": fact.fact_type,
                "confidence": round(fact.confidence, 3),
                "admin_url": admin_url("fact", fact.pk),
            }
        )
    episodes = []
    if user is not None:
        episodes = [
            {
                "id": e.pk,
                "summary": e.gist,
                "success": e.success,
                "started_at": e.started_at.isoformat(),
                "admin_url": admin_url("episode", e.pk),
            }
            for e in service.recent_episodes(agent_id=workflow.slug, user_id=user_id, limit=RECENT_EPISODES)
        ]
    if query.get("message", "").strip():
        context = {"channel": query["channel"]}
        procedures = service.matching_procedures(
            query["message"], context, agent_id=workflow.slug, limit=workflow_settings.PROMPT_PROCEDURES
        )
    else:
        procedures = service.list_procedures(agent_id=workflow.slug, active_only=True)
    return {
        "user": (
            {"id": user.pk, "canonical_id": user.canonical_id, "display_name": user.display_name}
            if user is not None
            else None
        ),
        "thread_id": session_id,
        "facts": facts,
        "episodes": episodes,
        "procedures": [
            {"id": p.pk, "name": p.name, "description": p.description, "procedure_type": p.procedure_type}
            for p in procedures
        ],
    }


# ------------------------------------------------------------------ run records


class RunSerializer(serializers.ModelSerializer):
    workflow = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = WorkflowRun
        fields = [
            "id",
            "workflow",
            "workflow_version",
            "trigger",
            "channel",
            "external_id",
            "user",
            "thread_id",
            "reply",
            "errors",
            "status",
            "started_at",
            "finished_at",
            "duration_ms",
        ]
        read_only_fields = fields


class RunDetailSerializer(RunSerializer):
    events = serializers.JSONField(read_only=True, help_text="The run's events as its stream sent them.")

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "input", "events"]
        read_only_fields = fields


class RunFilter(django_filters.FilterSet):
    workflow = django_filters.CharFilter(field_name="workflow__slug", max_length=100, help_text="Workflow slug.")
    user = IdFilter(field_name="user_id", help_text="Memory user id: that person's runs.")
    status = django_filters.ChoiceFilter(choices=RunStatus.choices)
    trigger = django_filters.CharFilter(max_length=20)

    class Meta:
        model = WorkflowRun
        fields = ["workflow", "user", "status", "trigger"]


@extend_schema_view(
    list=extend_schema(description="Workflow runs, newest first (without their events: retrieve one for them)."),
    retrieve=extend_schema(description="A run with its input and every event its stream sent."),
    destroy=extend_schema(description="Delete a run's record."),
    batch_delete=extend_schema(
        request=BatchDeleteSerializer,
        responses={200: BatchDeleteResultSerializer},
        description="Delete runs by id. Malformed ids or more than the limit: 400, nothing deleted.",
    ),
)
class RunViewSet(
    StaffAPI, mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    """Runs of workflows, kept with their events: listed, inspected and deleted by operators."""

    serializer_class = RunSerializer
    filterset_class = RunFilter
    ordering_fields = ["started_at", "duration_ms", "id"]
    ordering = ["-started_at", "-id"]
    lookup_value_regex = "[^/]+"

    def get_queryset(self):
        runs = WorkflowRun.objects.select_related("workflow")
        return runs if self.action == "retrieve" else runs.defer("events", "input")

    def get_serializer_class(self):
        if self.action == "batch_delete":
            return BatchDeleteSerializer
        if self.action == "retrieve":
            return RunDetailSerializer
        return self.serializer_class

    def perform_destroy(self, instance):
        delete_runs([instance.pk])

    @action(detail=False, methods=["post"], url_path="batch-delete")
    def batch_delete(self, request):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        with transaction.atomic():
            result = delete_runs(serializer.validated_data["ids"])
        return Response(BatchDeleteResultSerializer({"deleted": result.deleted, "not_found": result.not_found}).data)


# One server-sent event as OpenAPI 3.0 describes an event stream's item (the schema of
# `text/event-stream` is each event's fields: `event` and `data`, as clients such as EventSource parse
# them). Every event names its type and carries a JSON object; the stream sends no `id` or `retry`.
SSE_EVENT_SCHEMA = {
    "type": "object",
    "properties": {
        "event": {
            "type": "string",
            "enum": [
                EventType.RUN_STARTED,
                EventType.NODE_STARTED,
                EventType.NODE_FINISHED,
                EventType.NODE_ERROR,
                EventType.RUN_FINISHED,
            ],
        },
        "data": {"type": "string", "pattern": r"^\{", "description": "The event's payload, a JSON object."},
    },
    "required": ["event", "data"],
    "additionalProperties": False,
}

STREAM_SCHEMA = extend_schema(
    request=StreamRunSerializer,
    responses={
        (200, "text/event-stream"): OpenApiResponse(
            SSE_EVENT_SCHEMA,
            description="Server-sent events: run_started, node_started, node_finished | node_error, run_finished; "
            "each `event: <type>` with `data: <JSON object>`.",
        )
    },
    description="Run the workflow for a message from a person (channel + external id) and stream its events.",
)

# ------------------------------------------------------------------ the built frontend

MISSING_BUILD = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Engram builder: not built</title></head>
<body style="font-family: sans-serif; max-width: 40em; margin: 3em auto">
<h1>The workflow builder is not built</h1>
<p>Its files are missing from this installation ({where}). Build it once:</p>
<pre>cd frontend
npm ci
npm run build</pre>
<p>An installed Engram wheel ships it built.</p>
</body></html>
"""


def builder_index_path():
    """The built builder's index.html among the static files (None if it was not built)."""
    found = finders.find(f"{BUILD_DIR}/index.html")
    return Path(found) if found else None


def _staff(request):
    return request.user.is_active and request.user.is_staff


def _to_login(next_url):
    return redirect_to_login(next_url, reverse("memories:login"))


def builder_page(request, path=""):
    """GET /builder/ (and its client-side routes): the built frontend's index.html, staff only.

    Its assets come from the static URL (WhiteNoise); the build names them under the default
    /static/, which is rewritten to this project's STATIC_URL. The page gets the CSRF cookie here.
    """
    if not _staff(request):
        return _to_login(request.get_full_path())
    index = builder_index_path()
    if index is None:
        return HttpResponse(
            MISSING_BUILD.format(where=escape(f"static/{BUILD_DIR}/index.html")), status=503, content_type="text/html"
        )
    html = index.read_text(encoding="utf-8")
    base = static(f"{BUILD_DIR}/")
    if base != f"/static/{BUILD_DIR}/":
        html = html.replace(f"/static/{BUILD_DIR}/", base)
    meta = f'<meta name="csrf-token" content="{escape(get_token(request))}">'
    html = html.replace("</head>", f"{meta}</head>", 1)
    response = HttpResponse(html, content_type="text/html; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    return response


def home(request):
    """/: staff to the builder, everyone else to the login (then the builder)."""
    builder = reverse("workflows:builder")
    if _staff(request):
        return HttpResponseRedirect(builder)
    return _to_login(builder)
