"""Viewsets of the operators' API: list, retrieve, delete and batch-delete each kind of memory.

Reads come from MemoryService querysets and deletes go through MemoryService, one transaction each.
"""

from django.db import transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from ..conf import memory_settings
from ..service import MemoryService
from . import serializers
from .filters import EpisodeFilter, FactFilter, MemoryUserFilter, ProcedureFilter, StoreItemFilter
from .policy import StaffAPI


class MemoryViewSet(
    StaffAPI, mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    """The endpoints every kind shares: list, retrieve, delete, batch-delete.

    A subclass names its queryset (`list_method`) and delete (`delete_method`) on MemoryService.
    """

    list_method = ""
    delete_method = ""
    batch_delete_serializer_class = serializers.BatchDeleteSerializer
    batch_delete_result_serializer_class = serializers.BatchDeleteResultSerializer
    ordering = ["-id"]
    # Any path segment reaches the view, so a malformed id is answered by the API (JSON 404), not
    # by Django's HTML page for unmatched URLs.
    lookup_value_regex = "[^/]+"

    @property
    def service(self):
        return MemoryService()

    def get_queryset(self):
        return getattr(self.service, self.list_method)()

    def get_serializer_class(self):
        if self.action == "batch_delete":
            return self.batch_delete_serializer_class
        return self.serializer_class

    def delete_ids(self, ids, data):
        return getattr(self.service, self.delete_method)(
            ids, max_ids=memory_settings.API_MAX_BATCH_IDS, actor=self.actor
        )

    @property
    def actor(self):
        """Who deletes, for the audit record (DeletionRecord)."""
        return f"api:{self.request.user.get_username()}"

    def perform_destroy(self, instance):
        with transaction.atomic():
            self.delete_ids([instance.pk], {})

    @action(detail=False, methods=["post"], url_path="batch-delete")
    def batch_delete(self, request):
        """Delete up to API_MAX_BATCH_IDS rows by id, all or nothing; ids that do not exist are reported."""
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        with transaction.atomic():
            result = self.delete_ids(serializer.validated_data["ids"], serializer.validated_data)
        body = {"deleted": result.deleted, "not_found": result.not_found}
        if result.cascaded:
            body["cascaded"] = result.cascaded
        return Response(self.batch_delete_result_serializer_class(body).data, status=status.HTTP_200_OK)


def _batch_schema(request, response, description):
    return extend_schema(request=request, responses={200: response}, description=description)


_BATCH = "Delete rows by id in one transaction. Malformed ids or more than the limit: 400, nothing deleted."


@extend_schema_view(
    batch_delete=_batch_schema(serializers.BatchDeleteSerializer, serializers.BatchDeleteResultSerializer, _BATCH)
)
class FactViewSet(MemoryViewSet):
    """Facts (semantic memory) of every owner."""

    serializer_class = serializers.FactSerializer
    filterset_class = FactFilter
    list_method, delete_method = "fact_list", "delete_facts"
    ordering_fields = ["id", "key", "confidence", "updated_at", "last_accessed", "access_count"]


@extend_schema_view(
    batch_delete=_batch_schema(serializers.BatchDeleteSerializer, serializers.BatchDeleteResultSerializer, _BATCH)
)
class EpisodeViewSet(MemoryViewSet):
    """Episodes (episodic memory): runs, what was said and done, how they ended."""

    serializer_class = serializers.EpisodeSerializer
    filterset_class = EpisodeFilter
    list_method, delete_method = "episode_list", "delete_episodes"
    ordering_fields = ["id", "started_at", "duration_ms", "agent_id"]


@extend_schema_view(
    batch_delete=_batch_schema(serializers.BatchDeleteSerializer, serializers.BatchDeleteResultSerializer, _BATCH)
)
class ProcedureViewSet(MemoryViewSet):
    """Procedures (procedural memory): how to do things and how well it worked."""

    serializer_class = serializers.ProcedureSerializer
    filterset_class = ProcedureFilter
    list_method, delete_method = "procedure_list", "delete_procedures"
    ordering_fields = ["id", "name", "times_used", "success_rate", "last_used"]


@extend_schema_view(
    batch_delete=_batch_schema(serializers.BatchDeleteSerializer, serializers.BatchDeleteResultSerializer, _BATCH)
)
class StoreItemViewSet(MemoryViewSet):
    """Items LangGraph graphs keep through EngramStore (workflows.store), by namespace."""

    serializer_class = serializers.StoreItemSerializer
    filterset_class = StoreItemFilter
    list_method, delete_method = "store_item_list", "delete_store_items"
    ordering_fields = ["id", "namespace", "key", "updated_at"]


_CASCADE = OpenApiParameter(
    "cascade",
    OpenApiTypes.BOOL,
    OpenApiParameter.QUERY,
    required=False,
    description="Also delete the user's facts, episodes, identities, merged aliases and conversation threads.",
)


@extend_schema_view(
    destroy=extend_schema(
        parameters=[_CASCADE], description="Delete a memory user; without cascade only one who holds nothing."
    ),
    batch_delete=_batch_schema(
        serializers.UserBatchDeleteSerializer,
        serializers.UserBatchDeleteResultSerializer,
        _BATCH + ' With "cascade": true this is "forget these people": everything that names them goes too.',
    ),
)
class MemoryUserViewSet(MemoryViewSet):
    """Memory users: one person across channels."""

    serializer_class = serializers.MemoryUserSerializer
    filterset_class = MemoryUserFilter
    list_method, delete_method = "memory_user_list", "delete_users"
    batch_delete_serializer_class = serializers.UserBatchDeleteSerializer
    batch_delete_result_serializer_class = serializers.UserBatchDeleteResultSerializer
    ordering_fields = ["id", "display_name", "canonical_id", "last_seen", "total_conversations"]
    action_query_parameters = {"destroy": {"cascade"}}

    def delete_ids(self, ids, data):
        return self.service.delete_users(
            ids, cascade=data.get("cascade", False), max_ids=memory_settings.API_MAX_BATCH_IDS, actor=self.actor
        )

    def perform_destroy(self, instance):
        raw = self.request.query_params.get("cascade", "false").strip().lower()
        if raw not in {"true", "false", "1", "0"}:
            raise ValidationError({"cascade": ["Must be true or false."]})
        with transaction.atomic():
            self.delete_ids([instance.pk], {"cascade": raw in {"true", "1"}})
