"""HTTP entry points: the node palette and workflow runs (staff API), and the Telegram webhook."""

import hmac
import logging

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db import DatabaseError
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response

from memory import validation
from memory.api.policy import StaffAPI
from memory.asynchronous import off_the_loop
from memory.exceptions import InvalidMemoryArgument

from .conf import workflow_settings
from .exceptions import InvalidTrigger
from .models import Workflow
from .registry import node_types
from .runtime import WorkflowNotFound, get_workflow, run_workflow
from .serializers import NodeTypeSerializer, WorkflowSerializer
from .telegram import handle_update
from .triggers import is_telegram_id, parse_trigger, telegram_update_ignored, telegram_update_kind

logger = logging.getLogger("engram.workflows")

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
RUN_TRIGGER_TYPES = ("chat", "webhook", "manual")


class NodeTypeViewSet(StaffAPI, viewsets.ViewSet):
    """GET /api/v1/node-types/: every node type with its config schema, inputs and outputs."""

    def list(self, request):
        return Response(NodeTypeSerializer([t.describe() for t in node_types()], many=True).data)


class WorkflowViewSet(StaffAPI, viewsets.ModelViewSet):
    """Workflows by slug (staff): list, create, update, delete; POST .../<slug>/run/ runs one with a JSON payload."""

    queryset = Workflow.objects.all()
    serializer_class = WorkflowSerializer
    lookup_field = "slug"

    @action(detail=True, methods=["post"])
    def run(self, request, slug=None):
        """Run the workflow: {"message", "email" | "user_id" | "user_name", "trigger": "chat" (default) | "webhook" | "manual", ...}."""
        try:
            workflow = get_workflow(slug)
        except WorkflowNotFound as exc:
            raise NotFound(str(exc)) from None
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


def _error(status_code, field, message):
    return JsonResponse({"ok": False, "errors": {field: [message]}}, status=status_code)


def _rejected(slug, field, message):
    """An update that can never succeed: acknowledged (200, so Telegram stops retrying it), logged, not run."""
    logger.warning("telegram webhook %s: update rejected: %s: %s", slug, field, message)
    return JsonResponse({"ok": False, "status": "rejected", "errors": {field: [message]}})


@csrf_exempt
@require_POST
async def telegram_webhook(request, slug):
    """POST /telegram/<slug>/webhook/: one Bot API update, authenticated by the secret-token header.

    An async view so that, under ASGI, updates run concurrently on worker threads: a sync view there
    runs on the one thread Django keeps per process for sync code, one update at a time (bench.webhook
    --server asgi). Under WSGI (and Django's test client) it runs on the request's own thread.

    Answers: 403 without the right secret token; 404 for an unknown or inactive workflow; 200 "ran",
    "duplicate" or "ignored"; 503 "busy" while another server process runs the update, and 503 with
    `reply_pending` while its reply waits in the outbox (so Telegram's retry comes back); 200
    "rejected" (logged, nothing written) for an update that can never succeed — not JSON, nested too deep, not shaped like an update, text no database can store — so
    Telegram does not retry it forever; 503 when the run cannot answer now (no bot token configured, the
    database failing): nothing is recorded, so Telegram's retry runs it once the cause is fixed.
    """
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
    # finds it finished, or sends the reply (workflows.outbox).
    return JsonResponse(outcome.as_dict(), status=outcome.http_status)
