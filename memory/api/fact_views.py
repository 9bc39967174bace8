"""Facts through MemoryService over HTTP: write one (POST /api/v1/facts/), and read what a viewer
sees now or at another time (GET /api/v1/facts/lookup/ and /search/: get_fact and search_facts).

Valid time (`valid_from`, `valid_to`: when a value holds in the world) is given with the write;
`valid_at` (world time) and `as_of` (recorded time) choose the time a read answers for. Dates are
ISO 8601 (a date, or a datetime; without an offset, UTC). A bad one is a 400 naming the field, and
nothing is written.
"""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from ..domain.facts import MAX_SEARCH_LENGTH
from ..exceptions import InvalidMemoryArgument
from ..models import FactType, Scope
from ..recall.service import MAX_RECALL_LIMIT
from ..service import MAX_ID
from .filters import check_query_parameters

# The service's argument names that the API spells otherwise (`user`, as in every list's filter).
API_NAMES = {"user_id": "user"}


def service_errors(call):
    """`call()`, an InvalidMemoryArgument re-raised under the API's name of its field."""
    try:
        return call()
    except InvalidMemoryArgument as exc:
        if exc.field in API_NAMES:
            exc.field = API_NAMES[exc.field]
        raise


class Viewer(serializers.Serializer):
    agent_id = serializers.CharField(required=False, allow_blank=True, max_length=128, default="")
    user = serializers.IntegerField(required=False, min_value=1, max_value=MAX_ID, allow_null=True, default=None)
    session_id = serializers.CharField(required=False, allow_blank=True, max_length=128, default="")


class Times(serializers.Serializer):
    """The times of a read, passed to the service as given: it reads them and names a bad one."""

    valid_at = serializers.CharField(
        required=False, default=None, help_text="World time: what held then (ISO 8601). Default: now."
    )
    as_of = serializers.CharField(
        required=False, default=None, help_text="Recorded time: what the memory said then (ISO 8601)."
    )


class FactLookupQuery(Viewer, Times):
    key = serializers.CharField(max_length=255)


class FactSearchQuery(Viewer, Times):
    q = serializers.CharField(max_length=MAX_SEARCH_LENGTH)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=MAX_RECALL_LIMIT, default=None)
    min_confidence = serializers.FloatField(required=False, min_value=0.0, max_value=1.0, default=None)
    fact_type = serializers.ChoiceField(choices=FactType.choices, required=False, default=None)


class FactWriteBody(serializers.Serializer):
    """MemoryService.set_fact's arguments."""

    key = serializers.CharField(max_length=255, trim_whitespace=False)
    value = serializers.JSONField()
    scope = serializers.ChoiceField(choices=Scope.choices, required=False, default=Scope.GLOBAL)
    agent_id = serializers.CharField(required=False, allow_blank=True, max_length=128, default="")
    user = serializers.IntegerField(required=False, min_value=1, max_value=MAX_ID, allow_null=True, default=None)
    session_id = serializers.CharField(required=False, allow_blank=True, max_length=128, default="")
    fact_type = serializers.ChoiceField(choices=FactType.choices, required=False, default=None)
    confidence = serializers.FloatField(required=False, min_value=0.0, max_value=1.0, default=None)
    valid_from = serializers.CharField(
        required=False, allow_null=True, default=None, help_text="When the value starts to hold (ISO 8601)."
    )
    valid_to = serializers.CharField(
        required=False, allow_null=True, default=None, help_text="When it stops holding (ISO 8601), after valid_from."
    )
    provenance = serializers.CharField(required=False, allow_blank=True, default="")
    team = serializers.CharField(
        required=False, allow_null=True, default=None, max_length=128, help_text="Scope team: the team's name."
    )


@extend_schema_field(OpenApiTypes.ANY)
class AnyValue(serializers.Field):
    def to_representation(self, value):
        return value


NULLABLE_TIME = {"type": "string", "format": "date-time", "nullable": True}


class FactState(serializers.Serializer):
    """A fact as a read answers it: its stored row, or (at another time) the version that held then."""

    fact_id = serializers.SerializerMethodField()
    key = serializers.CharField()
    value = AnyValue()
    fact_type = serializers.CharField()
    scope = serializers.CharField()
    scope_key = serializers.CharField()
    confidence = serializers.FloatField()
    valid_from = serializers.SerializerMethodField()
    valid_to = serializers.SerializerMethodField()
    recorded_at = serializers.DateTimeField(source="updated_at")

    def get_fact_id(self, item) -> int:
        return getattr(item, "fact_id", None) or item.pk

    @extend_schema_field(NULLABLE_TIME)
    def get_valid_from(self, item):
        start = item.valid_time[0]
        return None if start is None else serializers.DateTimeField().to_representation(start)

    @extend_schema_field(NULLABLE_TIME)
    def get_valid_to(self, item):
        end = item.valid_time[1]
        return None if end is None else serializers.DateTimeField().to_representation(end)


class FactLookupAnswer(serializers.Serializer):
    fact = FactState(allow_null=True)


class FactSearchAnswer(serializers.Serializer):
    count = serializers.IntegerField()
    results = FactState(many=True)


class FactWriteAnswer(serializers.Serializer):
    action = serializers.ChoiceField(choices=["created", "updated", "confirmed", "skipped"])
    fact = FactState()


def _query(request, serializer_class):
    check_query_parameters(request, set(serializer_class().fields) | {"format"})
    params = serializer_class(data=request.query_params)
    params.is_valid(raise_exception=True)
    return params.validated_data


class FactServiceActions:
    """The fact viewset's calls of MemoryService: create (set_fact), lookup (get_fact), search (search_facts)."""

    @extend_schema(
        request=FactWriteBody,
        responses={201: FactWriteAnswer, 200: FactWriteAnswer},
        description="Write a fact through MemoryService.set_fact: created (201), or confirmed, updated or "
        "skipped (200). A later value of the key closes the old one's valid time; the old value stays "
        "readable at its time (valid_at). A bad field: 400 naming it, nothing written.",
    )
    def create(self, request):
        body = FactWriteBody(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        data["user_id"] = data.pop("user")
        key, value = data.pop("key"), data.pop("value")
        write = service_errors(lambda: self.service.set_fact(key, value, **data))
        answer = FactWriteAnswer({"action": write.action, "fact": write.fact}).data
        return Response(answer, status=status.HTTP_201_CREATED if write.action == "created" else status.HTTP_200_OK)

    @extend_schema(
        parameters=[FactLookupQuery],
        responses={200: FactLookupAnswer},
        description="The fact `key` a viewer (agent_id, user, session_id) sees: the most specific one that "
        "holds now, or at valid_at (world time) as recorded by as_of (recorded time). `fact` is null "
        "when none does.",
    )
    @action(detail=False, methods=["get"], url_path="lookup", filterset_class=None, pagination_class=None)
    def lookup(self, request):
        data = _query(request, FactLookupQuery)
        found = service_errors(
            lambda: self.service.get_fact(
                data["key"],
                agent_id=data["agent_id"],
                user_id=data["user"],
                session_id=data["session_id"],
                valid_at=data["valid_at"],
                as_of=data["as_of"],
            )
        )
        return Response(FactLookupAnswer({"fact": found}).data)

    @extend_schema(
        parameters=[FactSearchQuery],
        responses={200: FactSearchAnswer},
        description="Facts a viewer sees whose key or value holds every word of q, most confident first: "
        "those that hold now, or at valid_at (world time) as recorded by as_of (recorded time).",
    )
    @action(detail=False, methods=["get"], url_path="search", filterset_class=None, pagination_class=None)
    def search(self, request):
        data = _query(request, FactSearchQuery)
        found = service_errors(
            lambda: self.service.search_facts(
                data["q"],
                agent_id=data["agent_id"],
                user_id=data["user"],
                session_id=data["session_id"],
                limit=data["limit"],
                min_confidence=data["min_confidence"],
                fact_type=data["fact_type"],
                valid_at=data["valid_at"],
                as_of=data["as_of"],
            )
        )
        return Response(FactSearchAnswer({"count": len(found), "results": found}).data)
