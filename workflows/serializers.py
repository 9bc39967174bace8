"""Serializers of the workflows API."""
from rest_framework import serializers

from .models import Workflow


class NodeTypeSerializer(serializers.Serializer):
    name = serializers.CharField()
    category = serializers.CharField()
    description = serializers.CharField()
    config_schema = serializers.JSONField()
    inputs = serializers.ListField(child=serializers.CharField())
    outputs = serializers.ListField(child=serializers.CharField())


class WorkflowSerializer(serializers.ModelSerializer):
    class Meta:
        model = Workflow
        fields = ["id", "slug", "name", "description", "definition", "is_active", "created_at", "updated_at"]
        read_only_fields = fields
