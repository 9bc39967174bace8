"""Serializers of the workflows API."""

from django.db import models
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from memory.api.serializers import StrictBooleanField

from .definition import validate_definition
from .exceptions import InvalidDefinition
from .models import Workflow


class NodeTypeSerializer(serializers.Serializer):
    name = serializers.CharField()
    category = serializers.CharField()
    description = serializers.CharField()
    config_schema = serializers.JSONField()
    inputs = serializers.ListField(child=serializers.CharField())
    outputs = serializers.ListField(child=serializers.CharField())


@extend_schema_field(
    {
        "type": "object",
        "description": "Nodes (id, registered type, config) and the edges between them; checked against the "
        "node registry on save (unknown type, bad config, dangling edge, cycle without exit: a 400 naming the node).",
        "properties": {
            "nodes": {"type": "array", "items": {"type": "object"}},
            "edges": {"type": "array", "items": {"type": "object"}},
        },
        "required": ["nodes", "edges"],
    }
)
class DefinitionField(serializers.JSONField):
    """A workflow definition: a JSON object, never null."""


class _StrictText:
    """JSON strings only: DRF would turn 0 or true into "0" / "True", which the schema does not allow."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictCharField(_StrictText, serializers.CharField):
    pass


class StrictSlugField(_StrictText, serializers.SlugField):
    pass


class WorkflowSerializer(serializers.ModelSerializer):
    """A workflow; its definition is checked against the node registry (errors name the node)."""

    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.CharField: StrictCharField,
        models.TextField: StrictCharField,
        models.SlugField: StrictSlugField,
    }

    definition = DefinitionField()
    is_active = StrictBooleanField(required=False, default=True)

    class Meta:
        model = Workflow
        fields = ["id", "slug", "name", "description", "definition", "is_active", "created_at", "updated_at"]
        read_only_fields = ["id", "created_at", "updated_at"]

    def validate_definition(self, value):
        try:
            validate_definition(value)
        except InvalidDefinition as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value
