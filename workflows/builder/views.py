"""HTTP entry points: the node palette, workflows (versioned saves, validation, runs and their streams) of
the staff API, and the Telegram webhook."""

import hmac
import logging
import re

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db import DatabaseError, transaction
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response

from memory.api.policy import StaffAPI
from memory.asynchronous import off_the_loop
from memory.exceptions import InvalidMemoryArgument
from memory.rules import validation

from ..channels.telegram import handle_update
from ..conf import workflow_settings
from ..exceptions import InvalidTrigger
from ..graph.runtime import WorkflowNotFound, get_workflow, run_workflow
from ..graph.triggers import is_telegram_id, parse_trigger, telegram_update_ignored, telegram_update_kind
from ..language.definition import definition_errors
from ..language.registry import node_types
from ..models import Workflow
from .api import STREAM_SCHEMA, JSONOnly, MemoryViewQuerySerializer, memory_view, start_stream
from .serializers import (
    NodeTypeSerializer,
    ValidateDefinitionSerializer,
    ValidationResultSerializer,
    WorkflowSerializer,
)

logger = logging.getLogger("engram.workflows")

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
RUN_TRIGGER_TYPES = ("chat", "webhook", "manual")
IF_MATCH = OpenApiParameter(
    "If-Match",
    str,
    OpenApiParameter.HEADER,
    required=False,
    description='The version you edited, as the ETag gave it ("3"): a stale save is refused with 409.',
)


class NodeTypeViewSet(StaffAPI, viewsets.ViewSet):
    """GET /api/v1/node-types/: every node type with its config schema, inputs and outputs."""

    def list(self, request):
        return Response(NodeTypeSerializer([t.describe() for t in node_types()], many=True).data)


class StaleWorkflow(Exception):
    def __init__(self, current):
        self.current = current


def _etag(workflow):
    return f'"{workflow.version}"'


def _if_match(request):
    """The version an If-Match header names (None without one, or for "*")."""
    given = request.headers.get("If-Match")
    if given is None or given.strip() == "*":
        return None
    match = _ETAG.match(given.strip())
    if match is None:
        raise ValidationError({"If-Match": [f'must be the workflow\'s ETag, like "3"; got {given[:40]!r}']})
    return int(match.group(1))


_ETAG = re.compile(r'^(?:W/)?"?([0-9]{1,9})"?$')


@extend_schema_view(
    retrieve=extend_schema(description="A workflow; its ETag header is its version."),
    update=extend_schema(
        parameters=[IF_MATCH],
        responses={200: WorkflowSerializer, 409: OpenApiResponse(description="Stale: {detail, current}.")},
        description='Save a workflow. With If-Match: "<version>" a stale save (someone saved since) is a 409 '
        "carrying the current workflow, and nothing changes; without it the save always applies.",
    ),
    partial_update=extend_schema(
        parameters=[IF_MATCH],
        responses={200: WorkflowSerializer, 409: OpenApiResponse(description="Stale: {detail, current}.")},
        description="Save some fields of a workflow; If-Match as for PUT.",
    ),
    validate=extend_schema(
        request=ValidateDefinitionSerializer,
        responses={200: ValidationResultSerializer},
        description="Check a definition without saving it: every problem with the node, edge and field it is at.",
    ),
    run=extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT}),
    stream=STREAM_SCHEMA,
    memory_view=extend_schema(
        parameters=[MemoryViewQuerySerializer],
        responses={200: OpenApiTypes.OBJECT},
        description="A person's memory as this workflow's next run sees it: facts by winning scope, recent "
        "episodes, procedures. Nothing is created for an unknown person (user is null).",
    ),
)
class WorkflowViewSet(StaffAPI, viewsets.ModelViewSet):
    """Workflows by slug (staff): list, create, update (versioned with ETag / If-Match), delete; validate a
    definition; run one (POST .../<slug>/run/, or streamed as server-sent events: .../runs/stream/)."""

    queryset = Workflow.objects.all()
    serializer_class = WorkflowSerializer
    lookup_field = "slug"
    action_query_parameters = {"memory_view": {"channel", "external_id", "conversation_id", "message"}}

    def retrieve(self, request, *args, **kwargs):
        response = super().retrieve(request, *args, **kwargs)
        response["ETag"] = f'"{response.data["version"]}"'
        return response

    def create(self, request, *args, **kwargs):
        response = super().create(request, *args, **kwargs)
        response["ETag"] = f'"{response.data["version"]}"'
        return response

    def update(self, request, *args, **kwargs):
        expected = _if_match(request)
        try:
            with transaction.atomic():
                response = self._update(request, expected, partial=kwargs.pop("partial", False))
        except StaleWorkflow as stale:
            current = WorkflowSerializer(stale.current).data
            body = {
                "detail": f"The workflow was saved since you loaded it (now version {current['version']}, "
                f"you edited version {expected}): nothing was saved.",
                "current": current,
            }
            return Response(body, status=status.HTTP_409_CONFLICT, headers={"ETag": _etag(stale.current)})
        response["ETag"] = f'"{response.data["version"]}"'
        return response

    def _update(self, request, expected, *, partial):
        instance = self.get_object()
        # Locked until the save commits: two saves of one version cannot both pass the check.
        instance = Workflow.objects.select_for_update().get(pk=instance.pk)
        if expected is not None and instance.version != expected:
            raise StaleWorkflow(instance)
        serializer = self.get_serializer(instance, data=request.data, partial=partial)
        serializer.is_valid(raise_exception=True)
        serializer.save()
        return Response(serializer.data)

    @action(detail=False, methods=["post"])
    def validate(self, request):
        """Check a definition, saving nothing: {"valid", "errors": [{"node", "edge", "field", "message"}]}."""
        body = ValidateDefinitionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        errors = [e.as_dict() for e in definition_errors(body.validated_data["definition"])]
        return Response(ValidationResultSerializer({"valid": not errors, "errors": errors}).data)

    @action(detail=True, methods=["post"])
    def run(self, request, slug=None):
        """Run the workflow: {"message", "email" | "user_id" | "user_name", "trigger": "chat" (default) | "webhook" | "manual", ...}."""
        workflow = self._active(slug)
        payload = request.data
        if not isinstance(payload, dict):
            raise ValidationError({"payload": ["must be a JSON object"]})
        kind = payload.get("trigger", "chat")
        if kind not in RUN_TRIGGER_TYPES:
            raise ValidationError({"trigger": [f"must be one of {', '.join(RUN_TRIGGER_TYPES)}"]})
        try:
            result = run_workflow(
                workflow, {"type": kind, "payload": {k: v for k, v in payload.items() if k != "trigger"}}
            )
        except InvalidTrigger as exc:
            raise ValidationError({exc.field: [exc.message]}) from None
        return Response(result.as_dict(), status=status.HTTP_200_OK)

    @action(detail=True, methods=["post"], url_path="runs/stream", content_negotiation_class=JSONOnly)
    def stream(self, request, slug=None):
        """Run the workflow for {"message", "channel", "external_id", ...} and stream its events (text/event-stream)."""
        return start_stream(request, self._active(slug))

    @action(detail=True, methods=["get"], url_path="memory-view")
    def memory_view(self, request, slug=None):
        workflow = self.get_object()
        query = MemoryViewQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(memory_view(workflow, query.validated_data))

    def _active(self, slug):
        try:
            return get_workflow(slug)
        except WorkflowNotFound as exc:
            raise NotFound(str(exc)) from None


def _error(status_code, field, message):
    return JsonResponse({"ok": False, "errors": {field: [message]}}, status=status_code)


def _rejected(slug, field, message):
    """An update that can never succeed: acknowledged (200, so Telegram stops retrying it), logged, not run."""
    logger.warning("telegram webhook %s: update rejected: %s: %s", slug, field, message)
    return JsonResponse({"ok": False, "status": "rejected", "errors": {field: [message]}})


@csrf_exempt
async def telegram_webhook(request, slug):
    """POST /telegram/<slug>/webhook/: one Bot API update, authenticated by the secret-token header.

    An async view so that, under ASGI, updates run concurrently on worker threads: a sync view there
    runs on the one thread Django keeps per process for sync code, one update at a time (bench.webhook
    --server asgi). Under WSGI (and Django's test client) it runs on the request's own thread.

    Answers: 405 (JSON, `Allow: POST`) to any other method; 403 without the right secret token; 404 for
    an unknown or inactive workflow; 200 "ran", "duplicate" or "ignored"; 503 "busy" while another server
    process runs the update, and 503 with `reply_pending` while its reply waits in the outbox (so Telegram's
    retry comes back); 200 "rejected" (logged, nothing written) for an update that can never succeed — not
    JSON, nested too deep, not shaped like an update, text no database can store — so
    Telegram does not retry it forever; 503 when the run cannot answer now (no bot token configured, the
    database failing): nothing is recorded, so Telegram's retry runs it once the cause is fixed.
    """
    if request.method != "POST":  # as JSON, like every other answer here (require_POST's is an empty page)
        response = _error(405, "method", f"{request.method} is not allowed: POST is required (a Telegram update)")
        response["Allow"] = "POST"
        return response
    if isinstance(request, ASGIRequest):
        return await off_the_loop(_telegram_update)(request, slug)
    return await sync_to_async(_telegram_update)(request, slug)  # WSGI: on the request's own thread


def _telegram_update(request, slug):
    expected = workflow_settings.TELEGRAM_WEBHOOK_SECRET
    given = request.headers.get(SECRET_HEADER, "")
    if not expected:
        logger.warning("telegram webhook refused: set WORKFLOWS['TELEGRAM_WEBHOOK_SECRET'] to accept updates")
        return _error(403, "secret_token", "webhooks are disabled until a secret token is configured")
    if not hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode()):
        return _error(403, "secret_token", f"the {SECRET_HEADER} header is missing or wrong")
    try:
        workflow = get_workflow(slug)
    except WorkflowNotFound as exc:
        return _error(404, "slug", str(exc))
    try:
        update = validation.loads("body", request.body)
    except InvalidMemoryArgument as exc:  # named by where in the update it is (message.text)
        path = getattr(exc, "path", exc.field)
        return _rejected(slug, path.removeprefix("body.") or "body", getattr(exc, "problem", exc.message))
    if not isinstance(update, dict):
        return _rejected(slug, "body", "must be a JSON object (a Telegram Update)")
    update_id = update.get("update_id")
    if not is_telegram_id(update_id):
        return _rejected(slug, "update_id", "is missing or not a 64-bit integer")
    if telegram_update_kind(update) is not None and not telegram_update_ignored(update):
        try:
            parse_trigger({"type": "telegram", "payload": update})
        except InvalidTrigger as exc:
            return _rejected(slug, exc.field, exc.message)
    if not workflow_settings.TELEGRAM_BOT_TOKEN:
        logger.error(
            "telegram webhook %s: no bot token (WORKFLOWS['TELEGRAM_BOT_TOKEN']): update %s left for Telegram's retry",
            slug,
            update_id,
        )
        return _error(503, "bot_token", "no Telegram bot token is configured: the reply could not be sent")
    try:
        outcome = handle_update(workflow, update)
    except DatabaseError as exc:  # released by handle_update: Telegram's retry runs it
        logger.exception("telegram webhook %s: update %s failed; released for Telegram's retry", slug, update_id)
        return _error(503, "database", f"the update could not be processed now ({type(exc).__name__}); retry")
    # 503 while the update runs elsewhere or its reply waits in the outbox: Telegram's retry then
    # finds it finished, or sends the reply (workflows.channels.outbox).
    return JsonResponse(outcome.as_dict(), status=outcome.http_status)
