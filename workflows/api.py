"""The `checkpoints` and `reminders` REST APIs under /api/v1/: threads' checkpoints, and reminders.

A checkpoints resource is one conversation thread's checkpoints, and its id is the thread id
(`<memory user id>:<conversation id>:<workflow id>`): the list gives one row per tracked thread
(from the Thread rows, no saver calls), `GET /api/v1/checkpoints/<thread id>/` the thread with its
checkpoints newest first (through the saver's public `list`), and DELETE / `batch-delete` remove
threads with all their checkpoints and pending writes. Staff only; pagination, JSON parsing, errors
and permissions are the memory API's (memory/api/, REST_FRAMEWORK settings).
"""

import django_filters
from django.db import transaction
from drf_spectacular.utils import (
    OpenApiParameter,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
)
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response

from memory.api.filters import IdFilter
from memory.api.policy import StaffAPI
from memory.api.serializers import BatchDeleteResultSerializer, BatchDeleteSerializer
from memory.conf import memory_settings

from .conversations.checkpoints import (
    CHECKPOINT_ID_PATTERN,
    MAX_THREAD_ID_LENGTH,
    delete_checkpoints,
    is_valid_thread_id,
    thread_checkpoints,
    tracked_threads,
)
from .conversations.reminders import cancel_reminders, delete_reminders
from .models import Reminder, ReminderStatus, Thread

# Any characters but NUL (which no database column holds).
THREAD_ID_PATTERN = r"^[^\x00]+$"

# ------------------------------------------------------------------ serializers


class ThreadCheckpointsSerializer(serializers.ModelSerializer):
    workflow = serializers.SlugRelatedField(
        slug_field="slug",
        read_only=True,
        allow_null=True,
        help_text="The workflow's slug (null for a graph built in code).",
    )
    graph = serializers.CharField(
        read_only=True, help_text="The name of a graph built in code ('' for a workflow's thread)."
    )
    checkpoint_count = serializers.IntegerField(read_only=True, help_text="Checkpoints counted on this thread's runs.")
    head_checkpoint_id = serializers.CharField(read_only=True, help_text="The newest checkpoint counted ('' if none).")

    class Meta:
        model = Thread
        fields = [
            "thread_id",
            "user",
            "workflow",
            "graph",
            "conversation_id",
            "channel",
            "checkpoint_count",
            "head_checkpoint_id",
            "created_at",
            "last_activity",
        ]
        read_only_fields = fields


class CheckpointSerializer(serializers.Serializer):
    checkpoint_id = serializers.CharField()
    parent_checkpoint_id = serializers.CharField(allow_null=True)
    step = serializers.IntegerField(allow_null=True, help_text="The graph step that wrote it (-1: the input).")
    source = serializers.CharField(help_text="input, loop, update or fork.")
    blob_size = serializers.IntegerField(help_text="Bytes of the checkpoint as the saver serialises it.")
    created_at = serializers.DateTimeField(allow_null=True)
    message_count = serializers.IntegerField()
    pending_writes = serializers.IntegerField(help_text="Writes of an unfinished step stored with it.")


class ThreadCheckpointsDetailSerializer(ThreadCheckpointsSerializer):
    checkpoints = CheckpointSerializer(many=True, read_only=True, help_text="Newest first.")
    more = serializers.BooleanField(
        read_only=True, help_text="Older checkpoints exist: ask again with before=<last id>."
    )

    class Meta(ThreadCheckpointsSerializer.Meta):
        fields = [*ThreadCheckpointsSerializer.Meta.fields, "checkpoints", "more"]
        read_only_fields = fields


class CheckpointPageSerializer(serializers.Serializer):
    """The query of one thread's checkpoints: how many, older than which."""

    limit = serializers.IntegerField(required=False, min_value=1)
    before = serializers.RegexField(CHECKPOINT_ID_PATTERN, required=False, max_length=64)

    def validate_limit(self, value):
        if value > memory_settings.API_MAX_PAGE_SIZE:
            raise ValidationError(f"Ensure this value is less than or equal to {memory_settings.API_MAX_PAGE_SIZE}.")
        return value


@extend_schema_field(
    {"type": "string", "minLength": 1, "maxLength": MAX_THREAD_ID_LENGTH, "pattern": THREAD_ID_PATTERN}
)
class ThreadIdField(serializers.CharField):
    """A thread id given as a JSON string (numbers and the like are refused, not converted)."""

    default_error_messages = {"type": "Must be a thread id (a JSON string), got {kind}."}

    def __init__(self, **kwargs):
        kwargs.update(max_length=MAX_THREAD_ID_LENGTH, allow_blank=False, trim_whitespace=False)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("type", kind=type(data).__name__)
        return super().to_internal_value(data)


class ThreadBatchDeleteSerializer(serializers.Serializer):
    ids = serializers.ListField(
        child=ThreadIdField(),
        allow_empty=False,
        min_length=1,
        max_length=memory_settings.API_MAX_BATCH_IDS,
        help_text=f"Thread ids whose checkpoints (and the threads) to delete, at most {memory_settings.API_MAX_BATCH_IDS}.",
    )


class ThreadBatchDeleteResultSerializer(serializers.Serializer):
    deleted = serializers.IntegerField(help_text="How many threads were deleted with all their checkpoints.")
    not_found = serializers.ListField(child=serializers.CharField(), help_text="Thread ids nothing was known of.")


# ------------------------------------------------------------------ filters


class CheckpointFilter(django_filters.FilterSet):
    thread = django_filters.CharFilter(
        field_name="thread_id", max_length=MAX_THREAD_ID_LENGTH, help_text="A thread id."
    )
    user = IdFilter(field_name="user_id", help_text="Memory user id: that person's threads.")
    workflow = django_filters.CharFilter(field_name="workflow__slug", help_text="Workflow slug.")
    graph = django_filters.CharFilter(max_length=100, help_text="Name of a graph built in code.")
    channel = django_filters.CharFilter(help_text="Channel of the thread's latest message.")

    class Meta:
        model = Thread
        fields = ["thread", "user", "workflow", "graph", "channel"]


# ------------------------------------------------------------------ views

_THREAD_ID = OpenApiParameter(
    "thread_id",
    {"type": "string", "minLength": 1, "maxLength": MAX_THREAD_ID_LENGTH, "pattern": r"^[^/\x00]+$"},
    OpenApiParameter.PATH,
    description="The thread id, <memory user id>:<conversation id>:<workflow id> (or graph:<name>).",
)
_LIMIT = OpenApiParameter(
    "limit",
    {"type": "integer", "minimum": 1, "maximum": memory_settings.API_MAX_PAGE_SIZE},
    OpenApiParameter.QUERY,
    required=False,
    description="How many checkpoints (default API_PAGE_SIZE, at most API_MAX_PAGE_SIZE).",
)
_BEFORE = OpenApiParameter(
    "before",
    {"type": "string", "maxLength": 64, "pattern": CHECKPOINT_ID_PATTERN},
    OpenApiParameter.QUERY,
    required=False,
    description="Only checkpoints older than this checkpoint id (the last one of the previous answer).",
)


@extend_schema_view(
    list=extend_schema(description="Tracked conversation threads, one row per thread with its checkpoint count."),
    retrieve=extend_schema(
        parameters=[_THREAD_ID, _LIMIT, _BEFORE],
        responses={200: ThreadCheckpointsDetailSerializer},
        description="A thread and its checkpoints, newest first, read through the checkpointer.",
    ),
    destroy=extend_schema(
        parameters=[_THREAD_ID], description="Delete the thread with all its checkpoints and writes."
    ),
    batch_delete=extend_schema(
        request=ThreadBatchDeleteSerializer,
        responses={200: ThreadBatchDeleteResultSerializer},
        description="Delete threads by thread id, with all their checkpoints and writes, in one transaction. "
        "Malformed ids or more than the limit: 400, nothing deleted.",
    ),
)
class CheckpointViewSet(
    StaffAPI, mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    """Conversation checkpoints, per thread: the id of a checkpoints resource is its thread id."""

    serializer_class = ThreadCheckpointsSerializer
    filterset_class = CheckpointFilter
    lookup_field = "thread_id"
    # Any path segment reaches the view, so a malformed thread id is a JSON 404, not Django's HTML page.
    lookup_value_regex = "[^/]+"
    ordering_fields = ["last_activity", "created_at", "thread_id", "checkpoint_count"]
    action_query_parameters = {"retrieve": {"limit", "before"}}
    ordering = ["-last_activity", "-id"]

    def get_queryset(self):
        return tracked_threads()

    def get_serializer_class(self):
        if self.action == "batch_delete":
            return ThreadBatchDeleteSerializer
        if self.action == "retrieve":
            return ThreadCheckpointsDetailSerializer
        return self.serializer_class

    def get_object(self):
        if not is_valid_thread_id(self.kwargs.get(self.lookup_field)):
            raise NotFound("No such thread.")
        return super().get_object()

    def retrieve(self, request, *args, **kwargs):
        for name in ("limit", "before"):  # a form-style serializer would take `?limit=` for "not given"
            if request.query_params.get(name) == "":
                raise ValidationError({name: ["May not be blank."]})
        page = CheckpointPageSerializer(data=request.query_params)
        page.is_valid(raise_exception=True)
        thread = self.get_object()
        limit = page.validated_data.get("limit", memory_settings.API_PAGE_SIZE)
        rows = thread_checkpoints(thread.thread_id, limit=limit + 1, before=page.validated_data.get("before"))
        thread.checkpoints, thread.more = rows[:limit], len(rows) > limit
        return Response(ThreadCheckpointsDetailSerializer(thread).data)

    def perform_destroy(self, instance):
        with transaction.atomic():
            delete_checkpoints([instance.thread_id], actor=f"api:{self.request.user.get_username()}")

    @action(detail=False, methods=["post"], url_path="batch-delete")
    def batch_delete(self, request):
        """Delete up to API_MAX_BATCH_IDS threads by id, all or nothing; ids nothing was known of are reported."""
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        with transaction.atomic():
            result = delete_checkpoints(
                serializer.validated_data["ids"],
                max_ids=memory_settings.API_MAX_BATCH_IDS,
                actor=f"api:{request.user.get_username()}",
            )
        body = {"deleted": result.deleted, "not_found": result.not_found}
        return Response(ThreadBatchDeleteResultSerializer(body).data, status=status.HTTP_200_OK)


# ------------------------------------------------------------------ reminders


class ReminderSerializer(serializers.ModelSerializer):
    class Meta:
        model = Reminder
        fields = [
            "id",
            "user",
            "agent_id",
            "message",
            "due_at",
            "status",
            "attempts",
            "next_attempt_at",
            "last_error",
            "channel",
            "destination",
            "delivered_at",
            "created_at",
        ]
        read_only_fields = fields


class ReminderCancelResultSerializer(serializers.Serializer):
    cancelled = serializers.IntegerField(help_text="How many pending reminders were cancelled.")
    not_pending = serializers.IntegerField(
        help_text="Ids that were not cancelled: delivered, failed, already cancelled, being sent, or unknown."
    )


class ReminderFilter(django_filters.FilterSet):
    user = IdFilter(field_name="user_id", help_text="Memory user id: that person's reminders.")
    status = django_filters.ChoiceFilter(choices=ReminderStatus.choices)
    agent = django_filters.CharFilter(field_name="agent_id", max_length=128, help_text="The agent that set it.")
    channel = django_filters.CharFilter(max_length=50, help_text="The channel it was delivered through.")

    class Meta:
        model = Reminder
        fields = ["user", "status", "agent", "channel"]


@extend_schema_view(
    list=extend_schema(description="Reminders agents set with the remind tool, soonest first."),
    cancel=extend_schema(
        request=BatchDeleteSerializer,
        responses={200: ReminderCancelResultSerializer},
        description="Cancel reminders by id: those still pending and not being sent at this moment.",
    ),
    batch_delete=extend_schema(
        request=BatchDeleteSerializer,
        responses={200: BatchDeleteResultSerializer},
        description="Delete reminders by id. Malformed ids or more than the limit: 400, nothing deleted.",
    ),
)
class ReminderViewSet(
    StaffAPI, mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    """Reminders: listed, filtered, cancelled and deleted by operators (agents set them)."""

    serializer_class = ReminderSerializer
    filterset_class = ReminderFilter
    ordering_fields = ["due_at", "created_at", "id"]
    ordering = ["due_at", "id"]
    # Any path segment reaches the view, so a malformed id is a JSON 404, not Django's HTML page.
    lookup_value_regex = "[^/]+"

    def get_queryset(self):
        return Reminder.objects.all()

    def get_serializer_class(self):
        if self.action in ("cancel", "batch_delete"):
            return BatchDeleteSerializer
        return self.serializer_class

    def perform_destroy(self, instance):
        delete_reminders([instance.pk])

    @action(detail=False, methods=["post"])
    def cancel(self, request):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        result = cancel_reminders(serializer.validated_data["ids"])
        body = {"cancelled": result.cancelled, "not_pending": result.not_pending}
        return Response(ReminderCancelResultSerializer(body).data)

    @action(detail=False, methods=["post"], url_path="batch-delete")
    def batch_delete(self, request):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        with transaction.atomic():
            result = delete_reminders(serializer.validated_data["ids"])
        return Response(BatchDeleteResultSerializer({"deleted": result.deleted, "not_found": result.not_found}).data)
