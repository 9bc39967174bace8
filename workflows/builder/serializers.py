"""Serializers of the workflows API."""

from django.db import models
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.validators import UniqueValidator

from memory.api.serializers import StrictBooleanField

from ..exceptions import InvalidDefinition
from ..language.definition import validate_definition
from ..models import Workflow


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
        "description": "Nodes (id, registered type, config; the builder's position and label) and the edges "
        "between them, and the builder's layout (viewport); checked against the node registry on save (unknown "
        "type, bad config, dangling edge, cycle without exit: a 400 naming the node).",
        "properties": {
            "nodes": {"type": "array", "items": {"type": "object"}, "minItems": 1},
            "edges": {"type": "array", "items": {"type": "object"}, "description": "Default: none."},
            "layout": {"type": "object", "nullable": True},
        },
        "required": ["nodes"],
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
        fields = [
            "id",
            "slug",
            "name",
            "description",
            "definition",
            "is_active",
            "version",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "version", "created_at", "updated_at"]
        extra_kwargs = {
            "version": {"help_text": 'Counts saves; send it back as If-Match: "<version>" to save.'},
            # Slugs are unique over every workspace (webhook URLs name them): checked against all of
            # them, not only the current workspace's, so a taken slug is a 400, not a failed insert.
            "slug": {"validators": [UniqueValidator(queryset=Workflow._base_manager.all())]},
        }

    def validate_definition(self, value):
        try:
            validate_definition(value)
        except InvalidDefinition as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value


@extend_schema_field({"type": "object"})
class AnyDefinitionField(serializers.JSONField):
    """A definition to check: any JSON object (what is wrong inside it is the check's answer, not a 400)."""

    default_error_messages = {"not_object": "Must be a JSON object (a workflow definition)."}

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            self.fail("not_object")
        return super().to_internal_value(data)


class ValidateDefinitionSerializer(serializers.Serializer):
    definition = AnyDefinitionField(help_text="A workflow definition to check (nothing is saved).")


class DefinitionErrorSerializer(serializers.Serializer):
    node = serializers.CharField(allow_null=True, help_text="The node at fault (its id), if any.")
    edge = serializers.IntegerField(allow_null=True, help_text="The edge at fault (its index in edges), if any.")
    field = serializers.CharField(
        allow_null=True, help_text="Where in it: config.limit, position.x, target, layout.viewport.zoom, ..."
    )
    message = serializers.CharField()


class ValidationResultSerializer(serializers.Serializer):
    valid = serializers.BooleanField()
    errors = DefinitionErrorSerializer(many=True)
