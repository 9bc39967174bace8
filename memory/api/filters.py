"""Filters of the operators' API (django-filter): by owner, kind and text, on the service's querysets.

Query parameters are strict, as the README promises: an unknown parameter, a blank filter, an unknown
`ordering` field, text no database can store, or a search of too many words is a 400 naming the
parameter — never silently ignored (a typo'd filter would list everything), never a 500.
"""

from datetime import UTC

import django_filters
from django import forms
from django.db.models import Q
from drf_spectacular.utils import extend_schema_field
from rest_framework.exceptions import ValidationError
from rest_framework.filters import BaseFilterBackend, OrderingFilter

from ..exceptions import InvalidMemoryArgument
from ..models import (
    Episode,
    Fact,
    FactAction,
    FactHistory,
    FactType,
    MemoryRelation,
    MemoryUser,
    Procedure,
    ProcedureType,
    Promotion,
    RecallKind,
    Relation,
    Scope,
    StoreItem,
    Team,
)
from ..rules import validation
from ..service import MAX_ID
from ..text import concept_match, search_tokens

# Parameters every list and detail endpoint understands besides its filters.
COMMON_PARAMETERS = frozenset({"page", "page_size", "ordering", "format"})


def check_query_parameters(request, known, *, blank_allowed=()):
    """400 naming the first parameter that is unknown, repeated, blank (unless allowed) or unclean."""
    for name in request.query_params:
        if name not in known:
            raise ValidationError({name: [f"Unknown parameter; this endpoint takes {', '.join(sorted(known))}."]})
        values = request.query_params.getlist(name)
        if len(values) > 1:
            raise ValidationError({name: ["Give this parameter once."]})
        value = values[0]
        problem = validation.text_problem(value)
        if problem:
            raise ValidationError({name: [problem[0].upper() + problem[1:] + "."]})
        if value.strip() == "" and name not in blank_allowed:
            raise ValidationError({name: ["May not be blank."]})


class StrictQueryParameters(BaseFilterBackend):
    """Refuses query parameters the view does not know (its filterset's filters and the common ones)."""

    def filter_queryset(self, request, queryset, view):
        filterset = getattr(view, "filterset_class", None)
        filters = set(filterset.base_filters) if filterset is not None else set()
        blank_allowed = getattr(filterset, "blank_allowed", ()) if filterset is not None else ()
        # An action's own parameters (a user's DELETE ?cascade=, a thread's ?limit=&before=).
        own = set(getattr(view, "action_query_parameters", {}).get(getattr(view, "action", None), ()))
        check_query_parameters(request, filters | COMMON_PARAMETERS | own, blank_allowed=blank_allowed)
        return queryset


class StrictOrderingFilter(OrderingFilter):
    """DRF's ordering, but an unknown field is a 400 naming `ordering` (DRF drops it silently)."""

    def remove_invalid_fields(self, queryset, fields, view, request):
        valid = super().remove_invalid_fields(queryset, fields, view, request)
        unknown = [f for f in fields if f.lstrip("-") not in {v.lstrip("-") for v in valid}]
        if unknown:
            allowed = ", ".join(name for name, _ in self.get_valid_fields(queryset, view, {"request": request}))
            raise ValidationError({self.ordering_param: [f"Unknown field {unknown[0]!r}; order by {allowed}."]})
        return valid


def _search_words(value):
    """The words of a `search` filter: clean, and not so many that the query gets too large."""
    try:
        return validation.check_search("search", value).split()
    except InvalidMemoryArgument as exc:
        raise ValidationError({"search": [exc.message]}) from None


class _IdField(forms.IntegerField):
    def __init__(self, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", MAX_ID)
        super().__init__(**kwargs)


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": MAX_ID})
class IdFilter(django_filters.Filter):
    """A row id: a positive integer that fits the id column (anything else is a 400 naming the filter)."""

    field_class = _IdField


class _StrictBooleanField(forms.Field):
    def to_python(self, value):
        if value in self.empty_values:
            return None
        try:
            return validation.check_bool(self.label or "value", value, spelled=True)
        except InvalidMemoryArgument as exc:
            raise forms.ValidationError(exc.message) from None


@extend_schema_field({"type": "boolean"})
class StrictBooleanFilter(django_filters.Filter):
    """`true` or `false`; anything else is a 400 naming the filter (django-filter's own ignores it)."""

    field_class = _StrictBooleanField


class _UtcDateTimeField(django_filters.fields.IsoDateTimeField):
    def to_python(self, value):
        value = super().to_python(value)
        if value is None:
            return None
        try:
            return value.astimezone(UTC)
        except OverflowError:  # 0001-01-01T00:00+01:00 is in year 0 in UTC
            raise forms.ValidationError("Out of range once taken to UTC.", code="invalid") from None


class UtcDateTimeFilter(django_filters.IsoDateTimeFilter):
    """An ISO 8601 time, compared in UTC. ISO 8601 and Python allow a UTC offset of up to 24 hours,
    PostgreSQL only up to 15:59: "2025-01-01T10:00-20:19" passed on as it came failed the query (a 500)."""

    field_class = _UtcDateTimeField


def _every_word(queryset, fields, value):
    """Rows where each word of `value` occurs (case-insensitively) in one of `fields`."""
    for word in _search_words(value):
        match = Q()
        for field in fields:
            match |= Q(**{f"{field}__icontains": word})
        queryset = queryset.filter(match)
    return queryset


class ConceptFilter(django_filters.CharFilter):
    """`?concept=invoice`: rows tagged with that concept (memory.text.concept_tags derives the tags)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("help_text", "A concept tag the row carries (derived from its text), e.g. invoice.")
        super().__init__(**kwargs)

    def filter(self, qs, value):
        return qs.filter(concept_match(value)) if value else qs


class FactFilter(django_filters.FilterSet):
    scope = django_filters.ChoiceFilter(choices=Scope.choices)
    fact_type = django_filters.ChoiceFilter(choices=FactType.choices)
    agent_id = django_filters.CharFilter()
    session_id = django_filters.CharFilter()
    user = IdFilter(field_name="user_id", help_text="Memory user id (user-scoped facts).")
    team = django_filters.CharFilter(method="of_team", help_text="A team's name (its team-scoped facts).")
    concept = ConceptFilter()
    search = django_filters.CharFilter(
        method="search_text",
        help_text="Every word must occur in the key or value; spaces, '_' and '-' are equivalent.",
    )

    class Meta:
        model = Fact
        fields = ["scope", "fact_type", "agent_id", "session_id", "user"]

    def of_team(self, queryset, name, value):
        # An unknown team is a 400 naming the filter, not an empty list that reads as "no facts".
        team = Team.objects.filter(name=value).first()
        if team is None:
            raise ValidationError({"team": [f"No team named {value!r}."]})
        return queryset.filter(team=team)

    def search_text(self, queryset, name, value):
        # The same normalisation as MemoryService.search_facts (search_text is stored lower-cased).
        for token in search_tokens(" ".join(_search_words(value))):
            queryset = queryset.filter(search_text__contains=token)
        return queryset


class TeamFilter(django_filters.FilterSet):
    name = django_filters.CharFilter()
    agent_id = django_filters.CharFilter(field_name="members__agent_id", help_text="Teams this agent is a member of.")

    class Meta:
        model = Team
        fields = ["name", "agent_id"]


class EpisodeFilter(django_filters.FilterSet):
    agent_id = django_filters.CharFilter()
    user = IdFilter(field_name="user_id", help_text="Memory user id.")
    session_id = django_filters.CharFilter()
    workflow = django_filters.CharFilter()
    trigger_type = django_filters.CharFilter()
    success = StrictBooleanFilter()
    concept = ConceptFilter()
    search = django_filters.CharFilter(method="search_text", help_text="Words in the summary, agent or workflow.")

    class Meta:
        model = Episode
        fields = ["agent_id", "user", "session_id", "workflow", "trigger_type", "success"]

    def search_text(self, queryset, name, value):
        return _every_word(queryset, ["summary", "agent_id", "workflow"], value)


class ProcedureFilter(django_filters.FilterSet):
    agent_id = django_filters.CharFilter(help_text="Blank: procedures shared by every agent.")
    blank_allowed = ("agent_id",)
    procedure_type = django_filters.ChoiceFilter(choices=ProcedureType.choices)
    is_active = StrictBooleanFilter()
    search = django_filters.CharFilter(method="search_text", help_text="Words in the name or description.")

    class Meta:
        model = Procedure
        fields = ["agent_id", "procedure_type", "is_active"]

    def search_text(self, queryset, name, value):
        return _every_word(queryset, ["name", "description"], value)


class StoreItemFilter(django_filters.FilterSet):
    scope = django_filters.ChoiceFilter(choices=Scope.choices)
    agent_id = django_filters.CharFilter()
    user = IdFilter(field_name="user_id", help_text="Memory user id: that person's items.")
    namespace = django_filters.CharFilter(
        method="under_namespace", max_length=500, help_text="Labels joined by '.': items in it or below it."
    )

    class Meta:
        model = StoreItem
        fields = ["scope", "agent_id", "user", "namespace"]

    def under_namespace(self, queryset, name, value):
        return queryset.filter(Q(namespace=value) | Q(namespace__startswith=value + "."))


class MemoryUserFilter(django_filters.FilterSet):
    channel = django_filters.CharFilter(method="with_channel", help_text="Users with an identity on this channel.")
    search = django_filters.CharFilter(
        method="search_text", help_text="Words in the display name, canonical id or an identity's external id."
    )

    class Meta:
        model = MemoryUser
        fields = ["channel"]

    def with_channel(self, queryset, name, value):
        return queryset.filter(pk__in=MemoryUser.objects.filter(identities__channel=value).values("pk"))

    def search_text(self, queryset, name, value):
        for word in _search_words(value):
            queryset = queryset.filter(
                pk__in=MemoryUser.objects.filter(
                    Q(display_name__icontains=word)
                    | Q(canonical_id__icontains=word)
                    | Q(identities__external_id__icontains=word)
                ).values("pk")
            )
        return queryset


class FactVersionFilter(django_filters.FilterSet):
    fact = IdFilter(field_name="fact_id", help_text="Fact id: that fact's history (a deleted fact's too).")
    user = IdFilter(field_name="user_id", help_text="Memory user id (versions of user-scoped facts).")
    scope = django_filters.ChoiceFilter(choices=Scope.choices)
    key = django_filters.CharFilter(max_length=255)
    action = django_filters.ChoiceFilter(choices=FactAction.choices)
    valid_from_after = UtcDateTimeFilter(
        field_name="valid_from", lookup_expr="gte", help_text="Versions valid from this ISO 8601 time or later."
    )
    valid_from_before = UtcDateTimeFilter(
        field_name="valid_from", lookup_expr="lt", help_text="Versions valid from before this ISO 8601 time."
    )

    current = StrictBooleanFilter(help_text="Only each fact's current version (true), or only superseded ones.")

    class Meta:
        model = FactHistory
        fields = ["fact", "user", "scope", "key", "action", "current"]


class PromotionFilter(django_filters.FilterSet):
    rule = django_filters.ChoiceFilter(choices=Promotion.Rule.choices)
    user = IdFilter(field_name="user_id", help_text="Memory user id: whose memory the promotion became.")
    source_kind = django_filters.ChoiceFilter(choices=RecallKind.choices)

    class Meta:
        model = Promotion
        fields = ["rule", "user", "source_kind"]


class RelationFilter(django_filters.FilterSet):
    relation = django_filters.ChoiceFilter(choices=Relation.choices)
    # Applied together in filter_queryset: one memory is a kind and an id.
    kind = django_filters.ChoiceFilter(
        choices=RecallKind.choices, method="of_memory", help_text="With `item`: one memory's edges, either direction."
    )
    item = IdFilter(method="of_memory", help_text="With `kind`: the fact, episode or procedure id.")

    class Meta:
        model = MemoryRelation
        fields = ["relation"]

    def of_memory(self, queryset, name, value):
        return queryset

    def filter_queryset(self, queryset):
        queryset = super().filter_queryset(queryset)
        kind, item = self.form.cleaned_data.get("kind"), self.form.cleaned_data.get("item")
        if not kind and item is None:
            return queryset
        if not kind or item is None:
            missing = "kind" if not kind else "item"
            raise ValidationError({missing: ["Give kind and item together: they name one memory."]})
        return queryset.filter(Q(source__kind=kind, source__item_id=item) | Q(target__kind=kind, target__item_id=item))
