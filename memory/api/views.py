"""Viewsets of the operators' API: list, retrieve, delete and batch-delete each kind of memory.

Reads come from MemoryService querysets and deletes go through MemoryService, one transaction each.
"""

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from ..conf import memory_settings
from ..exceptions import InvalidMemoryArgument
from ..rules.validation import check_bool
from ..service import MemoryService
from . import serializers
from .fact_views import FactServiceActions
from .filters import (
    EpisodeFilter,
    FactFilter,
    FactVersionFilter,
    MemoryUserFilter,
    ProcedureFilter,
    PromotionFilter,
    RelationFilter,
    StoreItemFilter,
    TeamFilter,
)
from .policy import StaffAPI


class MemoryListViewSet(StaffAPI, mixins.ListModelMixin, viewsets.GenericViewSet):
    """A read-only list; a subclass names its queryset on MemoryService (`list_method`)."""

    list_method = ""
    ordering = ["-id"]
    # Any path segment reaches the view, so a malformed id is answered by the API (JSON 404), not
    # by Django's HTML page for unmatched URLs.
    lookup_value_regex = "[^/]+"

    @property
    def service(self):
        return MemoryService()

    def get_queryset(self):
        return getattr(self.service, self.list_method)()


class MemoryReadViewSet(mixins.RetrieveModelMixin, MemoryListViewSet):
    """List and retrieve."""


class MemoryViewSet(mixins.DestroyModelMixin, MemoryReadViewSet):
    """The endpoints every kind of memory shares: list, retrieve, delete, batch-delete.

    A subclass names its queryset (`list_method`) and delete (`delete_method`) on MemoryService.
    """

    delete_method = ""
    batch_delete_serializer_class = serializers.BatchDeleteSerializer
    batch_delete_result_serializer_class = serializers.BatchDeleteResultSerializer

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
            if result.erasure is not None:  # forgetting people: filled in by the commit just above
                body["erasure"] = result.erasure.as_dict()
        return Response(self.batch_delete_result_serializer_class(body).data, status=status.HTTP_200_OK)


def _validated(serializer_class, request):
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def audit_change(request, obj, message):
    """An edit made through the API, in the admin log as the admin records its own (never str(obj):
    it may name a person)."""
    LogEntry.objects.create(
        user_id=request.user.pk,
        content_type=ContentType.objects.get_for_model(obj, for_concrete_model=False),
        object_id=str(obj.pk),
        object_repr=f"{obj._meta.verbose_name} #{obj.pk}",
        action_flag=CHANGE,
        change_message=message,
    )


class PinMixin:
    """POST <id>/pin/ {"pinned": true|false}: an operator's pin (MemoryService.pin_memories)."""

    pin_kind = None

    @extend_schema(request=serializers.PinSerializer, responses={200: serializers.PinSerializer})
    @action(detail=True, methods=["post"], url_path="pin")
    def pin(self, request, pk=None):
        obj = self.get_object()
        pinned = _validated(serializers.PinSerializer, request)["pinned"]
        with transaction.atomic():
            changed, _ = self.service.pin_memories(self.pin_kind, [obj.pk], pinned=pinned)
            if changed:
                audit_change(request, obj, "Pinned through the API" if pinned else "Unpinned through the API")
        return Response({"pinned": pinned})


def _batch_schema(request, response, description):
    return extend_schema(request=request, responses={200: response}, description=description)


_BATCH = "Delete rows by id in one transaction. Malformed ids or more than the limit: 400, nothing deleted."


@extend_schema_view(
    batch_delete=_batch_schema(serializers.BatchDeleteSerializer, serializers.BatchDeleteResultSerializer, _BATCH)
)
class FactViewSet(FactServiceActions, PinMixin, MemoryViewSet):
    """Facts (semantic memory) of every owner; a write, and a viewer's reads, through MemoryService."""

    serializer_class = serializers.FactSerializer
    filterset_class = FactFilter
    list_method, delete_method = "fact_list", "delete_facts"
    ordering_fields = ["id", "key", "confidence", "updated_at", "last_accessed", "access_count"]
    pin_kind = "fact"

    def get_queryset(self):
        return super().get_queryset().select_related("team")  # a team fact shows its team's name


@extend_schema_view(
    batch_delete=_batch_schema(serializers.BatchDeleteSerializer, serializers.BatchDeleteResultSerializer, _BATCH)
)
class EpisodeViewSet(MemoryViewSet):
    """Episodes (episodic memory): runs, what was said and done, how they ended."""

    serializer_class = serializers.EpisodeSerializer
    filterset_class = EpisodeFilter
    list_method, delete_method = "episode_list", "delete_episodes"
    ordering_fields = ["id", "started_at", "duration_ms", "agent_id"]

    @extend_schema(request=serializers.FeedbackSerializer, responses={200: serializers.EpisodeSerializer})
    @action(detail=True, methods=["post"], url_path="feedback")
    def feedback(self, request, pk=None):
        """A person's feedback on the run: `feedback` (text) and/or `rating` (1 to 5, null clears it).
        Checked by the service (a bad value: 400 naming the field, nothing changes) and recorded in the
        admin log as an edit by the API user."""
        episode = self.get_object()
        data = _validated(serializers.FeedbackSerializer, request)
        with transaction.atomic():
            episode = self.service.episode_feedback(
                episode.pk,
                feedback=data.get("feedback"),
                rating=data.get("rating"),
                clear_rating="rating" in data and data["rating"] is None,
            )
            audit_change(request, episode, f"Feedback set through the API: {sorted(data)}")
        return Response(serializers.EpisodeSerializer(episode).data)


@extend_schema_view(
    batch_delete=_batch_schema(serializers.BatchDeleteSerializer, serializers.BatchDeleteResultSerializer, _BATCH)
)
class ProcedureViewSet(PinMixin, MemoryViewSet):
    """Procedures (procedural memory): how to do things and how well it worked."""

    serializer_class = serializers.ProcedureSerializer
    filterset_class = ProcedureFilter
    list_method, delete_method = "procedure_list", "delete_procedures"
    ordering_fields = ["id", "name", "times_used", "success_rate", "last_used"]
    pin_kind = "procedure"


@extend_schema_view(
    batch_delete=_batch_schema(serializers.BatchDeleteSerializer, serializers.BatchDeleteResultSerializer, _BATCH)
)
class StoreItemViewSet(MemoryViewSet):
    """Items LangGraph graphs keep through EngramStore (workflows.store), by namespace."""

    serializer_class = serializers.StoreItemSerializer
    filterset_class = StoreItemFilter
    list_method, delete_method = "store_item_list", "delete_store_items"
    ordering_fields = ["id", "namespace", "key", "updated_at"]


class FactVersionViewSet(MemoryReadViewSet):
    """Fact history: one row per change of a fact (memory/domain/history.py), of present and deleted facts;
    a fact's current version (`current`) has the id -<fact id> until a change supersedes it.

    Read only. History is the record of what the memory held; deleting a version would make
    point-in-time reads (`as_of`) answer something that was never true. Versions go with their fact's
    person (forget a person) and by MEMORY_LIMITS["MAX_VERSIONS_PER_FACT"], nothing else.
    """

    serializer_class = serializers.FactVersionSerializer
    filterset_class = FactVersionFilter
    list_method = "fact_version_list"
    ordering_fields = ["id", "valid_from", "fact_id", "key"]


class PromotionViewSet(MemoryReadViewSet):
    """The promotion ledger (memory/learning/promotion.py): memories the sweep made durable.

    Read only: the ledger is what keeps a source from being promoted twice; deleting a row would let
    the next sweep promote it again. Rows go with their person (forget a person).
    """

    serializer_class = serializers.PromotionSerializer
    filterset_class = PromotionFilter
    list_method = "promotion_list"
    ordering_fields = ["id", "promoted_at", "recalls", "sessions"]


class RelationViewSet(MemoryListViewSet):
    """Edges of the memory graph (memory/recall/relations.py), named by the memories they join.

    List only: edges are derived (by the embedding worker, consolidation and writes) and go with
    their memories; `?kind=&item=` lists one memory's edges in either direction.
    """

    serializer_class = serializers.RelationSerializer
    filterset_class = RelationFilter
    list_method = "relation_list"
    ordering = ["-weight", "id"]
    ordering_fields = ["id", "weight", "created_at"]


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
        try:
            cascade = check_bool("cascade", self.request.query_params.get("cascade", "false"), spelled=True)
        except InvalidMemoryArgument:
            raise ValidationError({"cascade": ["Must be true or false."]}) from None
        with transaction.atomic():
            self.delete_ids([instance.pk], {"cascade": cascade})


@extend_schema_view(
    create=extend_schema(
        request=serializers.TeamWriteSerializer,
        responses={201: serializers.TeamSerializer},
        description="Create a team of agents; a taken or blank name: 400 naming it, nothing written.",
    ),
    destroy=extend_schema(description="Delete a team, its memberships and its facts (their history keeps them)."),
)
class TeamViewSet(mixins.CreateModelMixin, mixins.DestroyModelMixin, MemoryReadViewSet):
    """Teams: named groups of agents that share facts (scope "team", between agent and global).

    `?agent_id=` lists the teams an agent is a member of; a team's facts: /api/v1/facts/?team=<name>.
    """

    serializer_class = serializers.TeamSerializer
    filterset_class = TeamFilter
    list_method = "team_list"
    ordering = ["name"]
    ordering_fields = ["id", "name", "created_at"]

    def create(self, request):
        data = _validated(serializers.TeamWriteSerializer, request)
        with transaction.atomic():
            team = self.service.create_team(data["name"], agent_ids=data["agent_ids"], description=data["description"])
        return Response(serializers.TeamSerializer(team).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        self.service.delete_team(instance.pk)

    @extend_schema(request=serializers.TeamMembersSerializer, responses={200: serializers.TeamSerializer})
    @action(detail=True, methods=["post"], url_path="members")
    def members(self, request, pk=None):
        """Add and remove member agents: {"add": [...], "remove": [...]}; a removed agent stops seeing
        the team's facts at its next read."""
        team = self.get_object()
        data = _validated(serializers.TeamMembersSerializer, request)
        self.service.set_team_members(team.pk, add=data["add"], remove=data["remove"])
        team = self.get_queryset().get(pk=team.pk)
        return Response(serializers.TeamSerializer(team).data)
