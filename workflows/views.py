"""HTTP entry points: the node palette and workflow runs (staff API), and the Telegram webhook."""
import hmac
import json
import logging

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response

from .conf import workflow_settings
from .exceptions import InvalidTrigger
from .models import Workflow
from .registry import node_types
from .runtime import WorkflowNotFound, get_workflow, run_workflow
from .serializers import NodeTypeSerializer, WorkflowSerializer
from .telegram import handle_update

logger = logging.getLogger("engram.workflows")

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
RUN_TRIGGER_TYPES = ("chat", "webhook", "manual")


class NodeTypeViewSet(viewsets.ViewSet):
    """GET /api/v1/node-types/: every node type with its config schema, inputs and outputs."""

    def list(self, request):
        return Response(NodeTypeSerializer([t.describe() for t in node_types()], many=True).data)


class WorkflowViewSet(viewsets.ModelViewSet):
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
            result = run_workflow(workflow, {"type": kind, "payload": {k: v for k, v in payload.items() if k != "trigger"}})
        except InvalidTrigger as exc:
            raise ValidationError({exc.field: [exc.message]}) from None
        return Response(result.as_dict(), status=status.HTTP_200_OK)


def _error(status_code, field, message):
    return JsonResponse({"ok": False, "errors": {field: [message]}}, status=status_code)


@csrf_exempt
@require_POST
def telegram_webhook(request, slug):
    """POST /telegram/<slug>/webhook/: one Bot API update, authenticated by the secret-token header."""
    expected = workflow_settings.TELEGRAM_WEBHOOK_SECRET
    given = request.headers.get(SECRET_HEADER, "")
    if not expected:
        logger.warning("telegram webhook refused: set WORKFLOWS['TELEGRAM_WEBHOOK_SECRET'] to accept updates")
        return _error(403, "secret_token", "webhooks are disabled until a secret token is configured")
    if not hmac.compare_digest(given.encode(), expected.encode()):
        return _error(403, "secret_token", f"the {SECRET_HEADER} header is missing or wrong")
    try:
        workflow = get_workflow(slug)
    except WorkflowNotFound as exc:
        return _error(404, "slug", str(exc))
    try:
        update = json.loads(request.body)
    except (UnicodeDecodeError, ValueError) as exc:
        return _error(400, "body", f"is not valid JSON ({exc})")
    if not isinstance(update, dict):
        return _error(400, "body", "must be a JSON object (a Telegram Update)")
    update_id = update.get("update_id")
    if isinstance(update_id, bool) or not isinstance(update_id, int):
        return _error(400, "update_id", "is missing or not an integer")
    try:
        outcome = handle_update(workflow, update)
    except InvalidTrigger as exc:
        return _error(400, exc.field, exc.message)
    return JsonResponse(outcome.as_dict())
