"""Models of the memory: facts, episodes, procedures, memory users and their channel identities.

Read and write them through `memory.service.MemoryService`; nothing else should touch these tables.
"""

from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from ..text import clip, fact_search_text
from .owners import Scope, Team, owner_key_expression
from .workspaces import UniqueInWorkspace, WorkspaceManager, workspace_field

PENDING_VECTOR = Q(embedding__isnull=True) & ~Q(text="")


class FactType(models.TextChoices):
    USER_PREFERENCE = "user_preference", "User preference"
    WORLD_KNOWLEDGE = "world_knowledge", "World knowledge"
    SELF_KNOWLEDGE = "self_knowledge", "Self knowledge"
    CORRECTION = "correction", "Correction"
    RELATIONSHIP = "relationship", "Relationship"


class ProcedureType(models.TextChoices):
    WORKFLOW_GRAPH = "workflow_graph", "Workflow graph"
    PROMPT_TEMPLATE = "prompt_template", "Prompt template"
    CODE_SNIPPET = "code_snippet", "Code snippet"
    TOOL_SEQUENCE = "tool_sequence", "Tool sequence"


class ProcedureSource(models.TextChoices):
    HUMAN = "human", "Taught by a human"
    LEARNED = "learned", "Learned from episodes"
    EVOLVED = "evolved", "Evolved from another procedure"


class MemoryUser(UniqueInWorkspace, models.Model):
    """One person, recognised across every channel they use."""

    workspace = workspace_field("memory_users")
    canonical_id = models.CharField(max_length=300)
    display_name = models.CharField(max_length=200, blank=True, default="")
    total_conversations = models.PositiveIntegerField(default=0)
    merged_into = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="merged_users"
    )
    merged_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen = models.DateTimeField(null=True, blank=True)

    objects = WorkspaceManager()

    class Meta:
        ordering = ["-last_seen", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["canonical_id", "workspace"], name="one_memory_user_per_canonical_id"),
            models.CheckConstraint(condition=~Q(merged_into=F("id")), name="memory_user_not_merged_into_self"),
        ]

    def __str__(self):
        return self.display_name or self.canonical_id


class ChannelIdentity(UniqueInWorkspace, models.Model):
    """A user's id on one channel (telegram, email, chat, webhook, ...); channels need no migration."""

    workspace = workspace_field("channel_identities")
    user = models.ForeignKey(MemoryUser, on_delete=models.CASCADE, related_name="identities")
    channel = models.CharField(max_length=50)
    external_id = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = WorkspaceManager()

    class Meta:
        ordering = ["channel", "external_id"]
        verbose_name_plural = "channel identities"
        constraints = [
            models.UniqueConstraint(
                fields=["channel", "external_id", "workspace"], name="one_user_per_channel_identity"
            ),
            models.CheckConstraint(condition=~Q(channel="") & ~Q(external_id=""), name="channel_identity_not_blank"),
        ]

    def __str__(self):
        return f"{self.channel}:{self.external_id}"


class Episode(models.Model):
    """A record of one run: what started it, what was said and done, and how it ended."""

    workspace = workspace_field("episodes")
    agent_id = models.CharField(max_length=128, blank=True, default="", db_index=True)
    user = models.ForeignKey(MemoryUser, null=True, blank=True, on_delete=models.CASCADE, related_name="episodes")
    session_id = models.CharField(max_length=128, blank=True, default="")
    workflow = models.CharField(max_length=128, blank=True, default="")
    trigger_type = models.CharField(max_length=50, blank=True, default="")
    trigger_input = models.JSONField(default=dict, blank=True)
    conversation = models.JSONField(default=list, blank=True)
    actions = models.JSONField(default=list, blank=True)
    final_output = models.JSONField(null=True, blank=True)
    success = models.BooleanField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    human_feedback = models.TextField(blank=True, default="")
    human_rating = models.SmallIntegerField(null=True, blank=True)
    started_at = models.DateTimeField(auto_now_add=True, db_index=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    summary = models.TextField(blank=True, default="")
    processed_for_facts = models.BooleanField(default=False)
    # Concept tags derived from the summary and messages (memory.text.episode_concepts), space-separated.
    concepts = models.CharField(max_length=300, blank=True, default="")

    objects = WorkspaceManager()

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [
            models.Index(fields=["user", "-started_at"], name="episode_user_recent"),
            models.Index(fields=["agent_id", "-started_at"], name="episode_agent_recent"),
            models.Index(fields=["processed_for_facts", "started_at"], name="episode_unprocessed"),
        ]

    def __str__(self):
        return f"Episode {self.pk} ({self.trigger_type or 'run'})"

    @property
    def gist(self):
        """The episode in one line: its summary, else its first message and first reply.

        A workflow's run records its conversation and leaves the summary to whoever can write one (a
        person, a consolidating model): a summary derived from the messages would repeat them in the
        episode's recall text, counting each word twice and doubling what the model embeds.
        """
        return episode_gist(self.summary, self.conversation)


class FactAction(models.TextChoices):
    """What one change of a fact was (a fact version's action)."""

    CREATED = "created", "Created"
    CONFIRMED = "confirmed", "Confirmed"
    UPDATED = "updated", "Updated"
    SKIPPED = "skipped", "Skipped"
    DELETED = "deleted", "Deleted"


class Fact(models.Model):
    """Semantic memory: one value under a key, owned by a session, user, agent, team or everyone."""

    workspace = workspace_field("facts")
    key = models.CharField(max_length=255)
    value = models.JSONField()
    fact_type = models.CharField(max_length=32, choices=FactType.choices, default=FactType.WORLD_KNOWLEDGE)
    scope = models.CharField(max_length=16, choices=Scope.choices)
    agent_id = models.CharField(max_length=128, blank=True, default="")
    user = models.ForeignKey(MemoryUser, null=True, blank=True, on_delete=models.CASCADE, related_name="facts")
    session_id = models.CharField(max_length=128, blank=True, default="")
    # A team fact's team: its facts go with it.
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="facts")
    # The owner in one indexable value (its owner key, memory/models/owners.py), derived by the
    # database so it can never disagree with the columns above.
    scope_key = models.GeneratedField(
        expression=owner_key_expression(),
        output_field=models.CharField(max_length=300),
        db_persist=True,
    )
    confidence = models.FloatField(default=0.8)
    times_confirmed = models.PositiveIntegerField(default=0)
    times_contradicted = models.PositiveIntegerField(default=0)
    source_episode = models.ForeignKey(
        Episode, null=True, blank=True, on_delete=models.SET_NULL, related_name="derived_facts"
    )
    provenance = models.TextField(blank=True, default="")
    access_count = models.PositiveIntegerField(default=0)
    last_accessed = models.DateTimeField(null=True, blank=True)
    # Key and value, lower-cased, with "_" and "-" read as spaces: what search matches against.
    search_text = models.TextField(blank=True, default="", editable=False)
    # Concept tags derived from the key and value (memory.text.fact_concepts), space-separated.
    concepts = models.CharField(max_length=300, blank=True, default="", editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # The change that gave the fact its current state, from updated_at on: its current version
    # (fact history keeps only superseded states as FactVersion rows; FactHistory reads both).
    # `change_provenance` None: the writer is the value's own (source_episode, provenance), as
    # for a create or an update; a confirmation or a refused write names its writer here.
    change_action = models.CharField(max_length=16, choices=FactAction.choices, default=FactAction.CREATED)
    change_source_episode_id = models.BigIntegerField(null=True, blank=True)
    change_provenance = models.TextField(null=True, blank=True, default=None)
    # Valid time: when the value holds in the world (NULL: since always / until further notice),
    # apart from when it was recorded (updated_at, fact history). A later value of the same key
    # closes it; the closed value stays in fact history with its interval (memory/domain/history.py).
    valid_from = models.DateTimeField(null=True, blank=True)
    valid_to = models.DateTimeField(null=True, blank=True)
    # Labels the writer gave (the remember tool's `tags`): lower-case words, for filtering lists.
    tags = models.JSONField(default=list, blank=True)
    # An operator's pin: the fact reaches every prompt of its viewers, before anything recalled.
    pinned = models.BooleanField(default=False)

    objects = WorkspaceManager()

    class Meta:
        ordering = ["key", "id"]
        constraints = [
            models.UniqueConstraint(fields=["scope_key", "key", "workspace"], name="one_fact_per_owner_and_key"),
            models.CheckConstraint(condition=Q(scope__in=Scope.values), name="fact_scope_known"),
            models.CheckConstraint(
                condition=(
                    Q(scope=Scope.SESSION, user__isnull=True, agent_id="", team__isnull=True) & ~Q(session_id="")
                    | Q(scope=Scope.USER, user__isnull=False, agent_id="", session_id="", team__isnull=True)
                    | Q(scope=Scope.AGENT, user__isnull=True, session_id="", team__isnull=True) & ~Q(agent_id="")
                    | Q(scope=Scope.TEAM, user__isnull=True, agent_id="", session_id="", team__isnull=False)
                    | Q(scope=Scope.GLOBAL, user__isnull=True, agent_id="", session_id="", team__isnull=True)
                ),
                name="fact_scope_has_its_owner",
            ),
            models.CheckConstraint(condition=Q(confidence__gte=0.0, confidence__lte=1.0), name="fact_confidence_0_1"),
            models.CheckConstraint(condition=~Q(key=""), name="fact_key_not_blank"),
        ]
        indexes = [
            # Owner lookups (an agent's facts included) use the unique (scope_key, key) index.
            # Lets a broad search ("key 5" matches half the store) read each visible owner's facts
            # best-first and stop at the limit.
            models.Index(fields=["scope_key", "-confidence"], name="fact_owner_confidence"),
        ]

    def __str__(self):
        return f"{self.key} ({self.scope_key})"

    @property
    def valid_time(self):
        """(valid_from, valid_to): when the value holds in the world (None: open at that end)."""
        return self.valid_from, self.valid_to

    def save(self, *args, **kwargs):
        # Whoever saves a fact (the admin included), search must see its current key and value.
        self.search_text = fact_search_text(self.key, self.value)
        update_fields = kwargs.get("update_fields")
        if update_fields is not None and {"key", "value"} & set(update_fields):
            kwargs["update_fields"] = {*update_fields, "search_text"}
        super().save(*args, **kwargs)


class FactVersion(models.Model):
    """A superseded state of a fact: what it said from `valid_from` until its next version, and who
    or what wrote it; or, with action `deleted`, the fact's end.

    Written by the service in the change's own transaction, before the change (memory/domain/history.py):
    a fact's current state is its own row (Fact.change_*), so a create writes no version (as in
    SQL:2011 system-versioned tables). Read every version, the current ones included, through
    FactHistory. `fact_id` is a plain number, not a foreign key: a deleted fact keeps its history.
    The owner columns and the workspace are copied so point-in-time reads apply the same isolation
    as current reads (agent, session and global owner keys are the same text in every workspace),
    and `user` is a foreign key so forgetting a person deletes their history with them.
    """

    fact_id = models.BigIntegerField()
    action = models.CharField(max_length=16, choices=FactAction.choices)
    key = models.CharField(max_length=255)
    value = models.JSONField()
    fact_type = models.CharField(max_length=32, choices=FactType.choices, default=FactType.WORLD_KNOWLEDGE)
    scope = models.CharField(max_length=16, choices=Scope.choices)
    # The fact's owner at the time ("user:<id>", ...): stored, since the fact row may be gone.
    scope_key = models.CharField(max_length=300)
    user = models.ForeignKey(MemoryUser, null=True, blank=True, on_delete=models.CASCADE, related_name="fact_versions")
    agent_id = models.CharField(max_length=128, blank=True, default="")
    session_id = models.CharField(max_length=128, blank=True, default="")
    # A team fact's team, by number (as fact_id: a deleted team's facts keep their history).
    team_id = models.BigIntegerField(null=True, blank=True)
    confidence = models.FloatField()
    # The episode the value came from (a number: the episode may be deleted later) and the writer's note.
    source_episode_id = models.BigIntegerField(null=True, blank=True)
    provenance = models.TextField(blank=True, default="")
    # When this version was recorded (system time; SQL:2011's name). Its valid time (world time,
    # the fact's valid_from/valid_to) is world_from/world_to, world_to closed at the start of the
    # later value that replaced it; recorded_world_to is the end it had while it was current (what
    # a read as_of a time before the replacement answers with).
    valid_from = models.DateTimeField()
    world_from = models.DateTimeField(null=True, blank=True)
    world_to = models.DateTimeField(null=True, blank=True)
    recorded_world_to = models.DateTimeField(null=True, blank=True)
    workspace = workspace_field("fact_versions")

    objects = WorkspaceManager()

    class Meta:
        db_table = "memory_fact_version"
        ordering = ["valid_from", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(action__in=FactAction.values), name="fact_version_action_known"),
        ]
        indexes = [
            # A fact's history, and trimming it to MAX_VERSIONS_PER_FACT.
            models.Index(fields=["fact_id", "valid_from"], name="fact_version_fact"),
            # Point-in-time reads: the latest version of an owner's key at a time.
            models.Index(fields=["scope_key", "key", "valid_from"], name="fact_version_owner_key"),
        ]

    def __str__(self):
        return f"{self.key} ({self.scope_key}) {self.action} at {self.valid_from:%Y-%m-%d %H:%M:%S}"


FACT_HISTORY_VIEW = "memory_fact_history"


class FactHistory(models.Model):
    """Every version of every fact: the superseded ones (FactVersion rows) and each fact's current
    one (its row), as one read-only database view (migration 0017).

    A current version's id is the negative of its fact's id (`current` is true); once superseded,
    that state is stored as a FactVersion with an id of its own.
    """

    fact_id = models.BigIntegerField()
    action = models.CharField(max_length=16, choices=FactAction.choices)
    key = models.CharField(max_length=255)
    value = models.JSONField()
    fact_type = models.CharField(max_length=32, choices=FactType.choices)
    scope = models.CharField(max_length=16, choices=Scope.choices)
    scope_key = models.CharField(max_length=300)
    user = models.ForeignKey(
        MemoryUser, null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    agent_id = models.CharField(max_length=128, blank=True)
    session_id = models.CharField(max_length=128, blank=True)
    confidence = models.FloatField()
    source_episode_id = models.BigIntegerField(null=True, blank=True)
    provenance = models.TextField(blank=True)
    valid_from = models.DateTimeField()
    current = models.BooleanField()
    world_from = models.DateTimeField(null=True, blank=True)
    world_to = models.DateTimeField(null=True, blank=True)
    recorded_world_to = models.DateTimeField(null=True, blank=True)
    workspace = models.ForeignKey(
        "memory.Workspace", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+", editable=False
    )

    objects = WorkspaceManager()

    @property
    def valid_time(self):
        """(start, end) of the version's valid time (world time), as known now: a Fact's valid_time."""
        return self.world_from, self.world_to

    @property
    def updated_at(self):
        """When this version was recorded (as a Fact's updated_at)."""
        return self.valid_from

    class Meta:
        managed = False
        db_table = FACT_HISTORY_VIEW
        ordering = ["valid_from", "id"]
        verbose_name_plural = "fact history"

    def __str__(self):
        return f"{self.key} ({self.scope_key}) {self.action} at {self.valid_from:%Y-%m-%d %H:%M:%S}"


class Procedure(UniqueInWorkspace, models.Model):
    """Procedural memory: how to do something, when it applies, and how well it has worked."""

    workspace = workspace_field("procedures")
    agent_id = models.CharField(max_length=128, blank=True, default="", help_text="Blank: shared by every agent.")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    trigger_conditions = models.JSONField(default=dict, blank=True)
    procedure_type = models.CharField(
        max_length=32, choices=ProcedureType.choices, default=ProcedureType.PROMPT_TEMPLATE
    )
    content = models.JSONField(default=dict, blank=True)
    times_used = models.PositiveIntegerField(default=0)
    times_succeeded = models.PositiveIntegerField(default=0)
    times_failed = models.PositiveIntegerField(default=0)
    success_rate = models.FloatField(default=0.0)
    avg_duration_ms = models.FloatField(default=0.0)
    source = models.CharField(max_length=16, choices=ProcedureSource.choices, default=ProcedureSource.HUMAN)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    is_active = models.BooleanField(default=True)
    last_used = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # An operator's pin: the (active) procedure reaches every prompt of its agent, whatever the query.
    pinned = models.BooleanField(default=False)

    objects = WorkspaceManager()

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["agent_id", "name", "workspace"], name="one_procedure_per_agent_and_name"),
            models.CheckConstraint(condition=~Q(name=""), name="procedure_name_not_blank"),
            models.CheckConstraint(
                condition=Q(success_rate__gte=0.0, success_rate__lte=1.0), name="procedure_success_rate_0_1"
            ),
        ]
        indexes = [models.Index(fields=["agent_id", "is_active", "-success_rate"], name="procedure_best_first")]

    def __str__(self):
        return self.name


class StoreItem(UniqueInWorkspace, models.Model):
    """An item of a LangGraph store (workflows.store.EngramStore): a JSON object under (namespace, key).

    The namespace decides the owner (MemoryService.store_owner): a person's namespace (("users", "<their
    id on a channel>", ...) and others of MEMORY["STORE_NAMESPACES"], or ("engram", "users", "<memory user
    id>", ...)) belongs to that memory user (deleted with them), ("agents", "<agent id>", ...) to that
    agent, any other namespace to everyone (global). Read and write them through MemoryService
    (memory/domain/store_items.py). `embedding` holds one float32 vector per indexed text, one after another.
    """

    workspace = workspace_field("store_items")
    # The namespace's labels joined by "." (LangGraph refuses labels holding a period).
    namespace = models.CharField(max_length=500)
    key = models.CharField(max_length=255)
    value = models.JSONField()
    scope = models.CharField(max_length=16, choices=Scope.choices)
    user = models.ForeignKey(MemoryUser, null=True, blank=True, on_delete=models.CASCADE, related_name="store_items")
    agent_id = models.CharField(max_length=128, blank=True, default="")
    # The text searches match (the indexed fields), and its embedding (float32) when one was made.
    text = models.TextField(blank=True, default="")
    embedding = models.BinaryField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    ttl_minutes = models.FloatField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True, db_index=True)

    objects = WorkspaceManager()

    class Meta:
        db_table = "memory_store_item"
        ordering = ["namespace", "key"]
        constraints = [
            models.UniqueConstraint(fields=["namespace", "key", "workspace"], name="one_store_item_per_key"),
            models.CheckConstraint(
                condition=Q(scope=Scope.USER, user__isnull=False)
                | (Q(scope=Scope.AGENT) & ~Q(agent_id="") & Q(user__isnull=True))
                | Q(scope=Scope.GLOBAL, user__isnull=True, agent_id=""),
                name="store_item_owner_matches_scope",
            ),
        ]
        indexes = [models.Index(fields=["id"], condition=PENDING_VECTOR, name="store_item_pending")]

    def __str__(self):
        return f"{self.namespace} / {self.key}"


def holds(item, when):
    """Whether a Fact (or a FactHistory version) holds in the world at `when`: its valid time contains it."""
    start, end = item.valid_time
    return (start is None or start <= when) and (end is None or end > when)


def holds_now(item):
    """holds(item, now), without reading the clock for an item open at both ends (most facts: a
    read of what holds now asks it of every row it returns)."""
    start, end = item.valid_time
    return (start is None and end is None) or holds(item, timezone.now())


def episode_gist(summary, conversation):
    """An episode's summary, else "said '<first message>'; replied '<first reply>'" (Episode.gist)."""
    if summary:
        return summary
    said = replied = ""
    for message in conversation or []:
        if not isinstance(message, dict):
            continue
        content = " ".join(str(message.get("content") or "").split())
        if message.get("role") == "assistant":
            replied = replied or content
        else:
            said = said or content
    parts = [f"said {clip(said, 120)!r}" if said else "", f"replied {clip(replied, 120)!r}" if replied else ""]
    return "; ".join(p for p in parts if p)
