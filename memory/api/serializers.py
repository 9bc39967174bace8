"""Serializers of the operators' API: one read-only shape per kind of memory, and the batch delete."""

from django.db import models
from rest_framework import serializers

from ..conf import memory_settings
from ..exceptions import InvalidMemoryArgument
from ..models import (
    ChannelIdentity,
    Episode,
    Fact,
    FactHistory,
    MemoryRelation,
    MemoryUser,
    Procedure,
    Promotion,
    StoreItem,
    Team,
)
from ..rules.validation import check_bool
from ..service import MAX_ID

# Digits shown of stored floats: confidence moves by repeated arithmetic (0.8 -> 0.8720000000000001).
FLOAT_DIGITS = 4


class RoundedFloatField(serializers.FloatField):
    """A float shown rounded to FLOAT_DIGITS; the stored value keeps its precision."""

    def to_representation(self, value):
        return round(float(value), FLOAT_DIGITS)


class MemorySerializer(serializers.ModelSerializer):
    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.FloatField: RoundedFloatField,
    }


class ConceptsMixin(serializers.Serializer):
    concepts = serializers.SerializerMethodField(help_text="Concept tags derived from the text (filter: ?concept=).")

    def get_concepts(self, obj) -> list[str]:
        return obj.concepts.split()


class FactSerializer(ConceptsMixin, MemorySerializer):
    team = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True, help_text="A team fact's team (null for other scopes)."
    )

    class Meta:
        model = Fact
        fields = [
            "id",
            "key",
            "value",
            "fact_type",
            "scope",
            "scope_key",
            "agent_id",
            "user",
            "session_id",
            "team",
            "confidence",
            "tags",
            "pinned",
            "times_confirmed",
            "times_contradicted",
            "source_episode",
            "provenance",
            "access_count",
            "last_accessed",
            "concepts",
            "created_at",
            "updated_at",
            "valid_from",
            "valid_to",
        ]
        read_only_fields = fields


class EpisodeSerializer(ConceptsMixin, MemorySerializer):
    class Meta:
        model = Episode
        fields = [
            "id",
            "agent_id",
            "user",
            "session_id",
            "workflow",
            "trigger_type",
            "trigger_input",
            "conversation",
            "actions",
            "final_output",
            "success",
            "error",
            "human_feedback",
            "human_rating",
            "started_at",
            "ended_at",
            "duration_ms",
            "summary",
            "processed_for_facts",
            "concepts",
        ]
        read_only_fields = fields


class StoreItemSerializer(MemorySerializer):
    namespace = serializers.SerializerMethodField(help_text="The namespace's labels.")

    class Meta:
        model = StoreItem
        fields = [
            "id",
            "namespace",
            "key",
            "value",
            "scope",
            "user",
            "agent_id",
            "created_at",
            "updated_at",
            "expires_at",
        ]
        read_only_fields = fields

    def get_namespace(self, obj) -> list[str]:
        return obj.namespace.split(".")


class ProcedureSerializer(MemorySerializer):
    class Meta:
        model = Procedure
        fields = [
            "id",
            "name",
            "agent_id",
            "description",
            "trigger_conditions",
            "procedure_type",
            "content",
            "times_used",
            "times_succeeded",
            "times_failed",
            "success_rate",
            "avg_duration_ms",
            "source",
            "parent",
            "is_active",
            "pinned",
            "last_used",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class FactVersionSerializer(MemorySerializer):
    """A version of a fact; its current one (`current`, listed with the id -<fact id> until a change
    supersedes it and it is kept under an id of its own) included."""

    class Meta:
        model = FactHistory
        fields = [
            "id",
            "fact_id",
            "action",
            "key",
            "value",
            "fact_type",
            "scope",
            "scope_key",
            "user",
            "agent_id",
            "session_id",
            "confidence",
            "source_episode_id",
            "provenance",
            "valid_from",
            "current",
            "world_from",
            "world_to",
            "recorded_world_to",
        ]
        read_only_fields = fields


class PromotionSerializer(MemorySerializer):
    class Meta:
        model = Promotion
        fields = [
            "id",
            "source_kind",
            "source_id",
            "rule",
            "user",
            "agent_id",
            "recalls",
            "sessions",
            "fact_ids",
            "promoted_at",
        ]
        read_only_fields = fields


class RelationSerializer(MemorySerializer):
    """An edge named by the memories it joins (documents are derived rows, their ids mean nothing outside)."""

    source_kind = serializers.CharField(source="source.kind", read_only=True, help_text="fact, episode or procedure.")
    source_item = serializers.IntegerField(source="source.item_id", read_only=True, help_text="Its id.")
    target_kind = serializers.SerializerMethodField(
        help_text="fact, episode, procedure, or fact_version (contradicts)."
    )
    target_item = serializers.SerializerMethodField(help_text="Its id (a fact version's id for contradicts).")

    class Meta:
        model = MemoryRelation
        fields = ["id", "relation", "weight", "source_kind", "source_item", "target_kind", "target_item", "created_at"]
        read_only_fields = fields

    def get_target_kind(self, obj) -> str:
        return "fact_version" if obj.target_version_id is not None else obj.target.kind

    def get_target_item(self, obj) -> int:
        return obj.target_version_id if obj.target_version_id is not None else obj.target.item_id


class ChannelIdentitySerializer(serializers.ModelSerializer):
    class Meta:
        model = ChannelIdentity
        fields = ["channel", "external_id", "created_at"]
        read_only_fields = fields


class MemoryUserSerializer(serializers.ModelSerializer):
    identities = ChannelIdentitySerializer(many=True, read_only=True)
    email = serializers.SerializerMethodField()
    fact_count = serializers.IntegerField(read_only=True)
    episode_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = MemoryUser
        fields = [
            "id",
            "canonical_id",
            "display_name",
            "email",
            "identities",
            "total_conversations",
            "fact_count",
            "episode_count",
            "merged_into",
            "merged_at",
            "created_at",
            "last_seen",
        ]
        read_only_fields = fields

    def get_email(self, obj) -> str | None:
        """The external id of the user's email identity, if any (identities are prefetched)."""
        return next((i.external_id for i in obj.identities.all() if i.channel == "email"), None)


class StrictIdField(serializers.IntegerField):
    """A positive integer id given as a JSON integer: "12", 12.0 and true are refused."""

    default_error_messages = {"type": "Must be an integer id (a JSON number without a fraction), got {kind}."}

    def __init__(self, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", MAX_ID)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("type", kind=type(data).__name__)
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """JSON true or false only ("true", 1 and the like are refused)."""

    def to_internal_value(self, data):
        try:
            return check_bool(self.field_name, data)
        except InvalidMemoryArgument:
            self.fail("invalid", input=data)


class BatchDeleteSerializer(serializers.Serializer):
    ids = serializers.ListField(
        child=StrictIdField(),
        allow_empty=False,
        min_length=1,
        max_length=memory_settings.API_MAX_BATCH_IDS,
        help_text=f"The ids to delete, at most {memory_settings.API_MAX_BATCH_IDS} per request.",
    )


class UserBatchDeleteSerializer(BatchDeleteSerializer):
    cascade = StrictBooleanField(
        default=False,
        help_text="Also delete the users' facts, episodes, identities, merged aliases, recall events and "
        "conversation threads with their checkpoints.",
    )


class BatchDeleteResultSerializer(serializers.Serializer):
    deleted = serializers.IntegerField(help_text="How many rows were deleted.")
    not_found = serializers.ListField(child=serializers.IntegerField(), help_text="Requested ids that did not exist.")


class CascadedSerializer(serializers.Serializer):
    facts = serializers.IntegerField()
    episodes = serializers.IntegerField()
    identities = serializers.IntegerField()
    merged_users = serializers.IntegerField()
    recall_events = serializers.IntegerField()
    threads = serializers.IntegerField(help_text="Conversation threads (their checkpoints go too).")
    checkpoints = serializers.IntegerField()


class ErasureSerializer(serializers.Serializer):
    complete = serializers.BooleanField(
        help_text="True once every trace the deletion could reach is gone: statistics refreshed (PostgreSQL), "
        "the WAL truncated (SQLite). False with `problems` saying what is left."
    )
    pending = serializers.BooleanField(help_text="True if the deletion's transaction has not committed yet.")
    problems = serializers.ListField(child=serializers.CharField(), help_text="What could not be scrubbed, and why.")
    statistics_refreshed = serializers.ListField(
        child=serializers.CharField(), help_text="PostgreSQL: the tables analyzed again after the deletion."
    )


class UserBatchDeleteResultSerializer(BatchDeleteResultSerializer):
    cascaded = CascadedSerializer(required=False, help_text="What went with the users (cascade only).")
    erasure = ErasureSerializer(required=False, help_text="What the scrub after the commit did (cascade only).")


class PinSerializer(serializers.Serializer):
    pinned = StrictBooleanField(
        help_text="true: the fact or procedure reaches every prompt of those who see it, first; false: unpin."
    )


class StrictCharField(serializers.CharField):
    """A JSON string only (12 and true are refused, not read as "12" and "True")."""

    default_error_messages = {"type": "Must be a string, got {kind}."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("type", kind=type(data).__name__)
        return super().to_internal_value(data)


class FeedbackSerializer(serializers.Serializer):
    feedback = StrictCharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text="A person's comment on the run (blank clears it).",
    )
    rating = StrictIdField(
        required=False, allow_null=True, max_value=5, help_text="1 (bad) to 5 (good); null clears the rating."
    )


class TeamSerializer(MemorySerializer):
    """A team: a named group of agents that share facts (scope "team")."""

    agent_ids = serializers.SerializerMethodField(help_text="The member agents, sorted.")

    class Meta:
        model = Team
        fields = ["id", "name", "description", "agent_ids", "created_at"]
        read_only_fields = fields

    def get_agent_ids(self, team) -> list[str]:
        return sorted(m.agent_id for m in team.members.all())


class TeamWriteSerializer(serializers.Serializer):
    """MemoryService.create_team's arguments (the service checks them and names a bad one)."""

    name = StrictCharField(max_length=128)
    description = StrictCharField(required=False, allow_blank=True, default="")
    agent_ids = serializers.ListField(child=StrictCharField(max_length=128), required=False, default=list)


class TeamMembersSerializer(serializers.Serializer):
    """Agents to add to and remove from a team."""

    add = serializers.ListField(child=StrictCharField(max_length=128), required=False, default=list)
    remove = serializers.ListField(child=StrictCharField(max_length=128), required=False, default=list)
