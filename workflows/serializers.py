"""Serializers of the workflows API."""
from rest_framework import serializers

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


class WorkflowSerializer(serializers.ModelSerializer):
    """A workflow; its definition is checked against the node registry (errors name the node)."""

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
