"""GET /api/v1/recall/?q=...: hybrid recall over HTTP for staff, through MemoryService.recall."""

from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from ..embedding.embedder import EmbeddingModelChanged
from ..exceptions import InvalidMemoryArgument
from ..recall.ranking import MODES
from ..recall.service import MAX_QUERY_LENGTH, MAX_RECALL_LIMIT
from ..service import MAX_ID, MemoryService
from .filters import check_query_parameters
from .policy import StaffAPI


class RecallQuerySerializer(serializers.Serializer):
    """The query string of a recall request."""

    q = serializers.CharField(max_length=MAX_QUERY_LENGTH, trim_whitespace=True)
    agent_id = serializers.CharField(required=False, allow_blank=True, max_length=128, default="")
    # `user`, as in every list's filter: one name per parameter across the API.
    user = serializers.IntegerField(required=False, min_value=1, max_value=MAX_ID, allow_null=True, default=None)
    session_id = serializers.CharField(required=False, allow_blank=True, max_length=128, default="")
    types = serializers.CharField(required=False, default="facts,episodes,procedures")
    limit = serializers.IntegerField(required=False, min_value=1, max_value=MAX_RECALL_LIMIT, default=None)
    min_confidence = serializers.FloatField(required=False, min_value=0.0, max_value=1.0, default=None)
    mode = serializers.ChoiceField(choices=MODES, required=False, default="auto")
    # Passed as given: the service reads ISO 8601 and names a bad one.
    valid_at = serializers.CharField(
        required=False, default=None, help_text="World time (ISO 8601): facts as they held then."
    )
    as_of = serializers.CharField(
        required=False, default=None, help_text="Recorded time (ISO 8601): what the memory said then."
    )


class RecallView(StaffAPI, APIView):
    """Recall the memories a viewer (agent, user, session) may see that best match `q`.

    Query parameters: q (required), agent_id, user (a memory user id), session_id, types
    (comma-separated: facts, episodes, procedures), limit, min_confidence, mode (auto, hybrid,
    keyword, vector), valid_at (world time) and as_of (recorded time), ISO 8601; any other parameter, a blank or a repeated one is a 400 naming it. Answers
    {"query", "mode", "count", "results": [{"kind", "id", "text", "score", ..., "item": {...}}]};
    a bad parameter answers 400 naming it; vectors of another embedding model answer 409.
    """

    def get(self, request):
        check_query_parameters(request, set(RecallQuerySerializer().fields) | {"format"})
        params = RecallQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        data = params.validated_data
        try:
            result = MemoryService().recall(
                data["q"],
                agent_id=data["agent_id"],
                user_id=data["user"],
                session_id=data["session_id"],
                types=data["types"],
                limit=data["limit"],
                min_confidence=data["min_confidence"],
                mode=data["mode"],
                valid_at=data["valid_at"],
                as_of=data["as_of"],
            )
        except InvalidMemoryArgument as exc:
            field = {"query": "q", "user_id": "user"}.get(exc.field, exc.field)
            return Response({field: [exc.message]}, status=status.HTTP_400_BAD_REQUEST)
        except EmbeddingModelChanged as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(
            {
                "query": data["q"],
                "mode": result.mode,
                "count": len(result),
                "results": [hit.as_dict() for hit in result],
            }
        )
