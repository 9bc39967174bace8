"""Tables of recall: its index of documents, owners' generations, the model record, the log of what recall
returned, the memory graph's edges and the promotions it led to."""

from django.db import models
from django.db.models import F, Q

from .memories import PENDING_VECTOR, FactVersion, MemoryUser
from .workspaces import DEFAULT_WORKSPACE_ID


class RecallKind(models.TextChoices):
    """What a recall hit is."""

    FACT = "fact", "Fact"
    EPISODE = "episode", "Episode"
    PROCEDURE = "procedure", "Procedure"


# A text waiting for its vector (the embedding worker's queue, as the database answers it).


class RecallDocument(models.Model):
    """One fact, episode or procedure as recall sees it: owner, text, embedding, importance.

    Rows are written by database triggers on the item tables (see migration recall_index), in the
    item's own transaction, so every writer (service, admin, merges, cascades) keeps them current;
    the service adds the embedding in the same transaction. Read it through MemoryService.recall().
    """

    kind = models.CharField(max_length=16, choices=RecallKind.choices)
    item_id = models.BigIntegerField()
    # Who sees it: a fact's scope_key; an episode's "user:<id>/agent:<id>", "user:<id>", "agent:<id>",
    # "session:<id>" or "global"; a procedure's "agent:<id>" or "global".
    owner = models.CharField(max_length=300)
    # Facts: the key; procedures: the name. A more specific owner's item with the same kind and
    # shadow key hides this one. Blank (episodes): never shadowed.
    shadow_key = models.CharField(max_length=255, blank=True, default="")
    active = models.BooleanField(default=True)
    text = models.TextField(blank=True, default="")
    # Facts: confidence; procedures: smoothed success rate; episodes: from the human rating (0.5 unrated).
    importance = models.FloatField(default=0.5)
    item_time = models.DateTimeField(null=True, blank=True)
    # float32 little-endian; NULL until the service (or `memory reindex`) embeds the text.
    embedding = models.BinaryField(null=True, blank=True)
    # The owner's RecallScope.generation when the embedding or owner last changed.
    vector_seq = models.BigIntegerField(default=0)
    reference_count = models.PositiveIntegerField(default=0)
    last_referenced = models.DateTimeField(null=True, blank=True)
    # The item's workspace (items never change workspace), copied by the same triggers: recall's
    # candidate queries and the vector index keep to the current workspace's documents with it,
    # since agent, session and global owners are the same text in every workspace.
    workspace_id = models.BigIntegerField(default=DEFAULT_WORKSPACE_ID, editable=False)

    class Meta:
        db_table = "memory_recall_doc"
        constraints = [
            models.UniqueConstraint(fields=["kind", "item_id"], name="one_recall_document_per_item"),
            models.CheckConstraint(condition=Q(kind__in=RecallKind.values), name="recall_document_kind_known"),
        ]
        indexes = [
            models.Index(fields=["owner", "vector_seq"], name="recall_doc_owner_seq"),
            models.Index(fields=["shadow_key", "kind", "owner"], name="recall_doc_shadow"),
            # The embedding worker's backlog (memory/recall/indexer.py), counted by every /healthz: small.
            models.Index(fields=["kind", "item_id"], condition=PENDING_VECTOR, name="recall_doc_pending"),
        ]

    def __str__(self):
        return f"{self.kind} {self.item_id} ({self.owner})"


class RecallScope(models.Model):
    """Per owner, a counter every process compares with its in-memory vector index before a recall."""

    owner = models.CharField(max_length=300, primary_key=True)
    generation = models.BigIntegerField(default=0)
    # Embedded documents that left this owner (deleted or moved); a reader rebuilds when many did.
    removed = models.BigIntegerField(default=0)

    class Meta:
        db_table = "memory_recall_scope"

    def __str__(self):
        return f"{self.owner} @{self.generation}"


class EmbeddingModelRecord(models.Model):
    """Which embedding model wrote the stored vectors, and their dimension (one row)."""

    model = models.CharField(max_length=300)
    dimension = models.PositiveIntegerField()
    recorded_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "memory_embedding_model"

    def __str__(self):
        return f"{self.model} ({self.dimension})"


class RecallEvent(models.Model):
    """One hit returned by a recall: who asked, what for, what came back and how it scored."""

    created_at = models.DateTimeField(db_index=True)
    agent_id = models.CharField(max_length=128, blank=True, default="")
    user_id = models.BigIntegerField(null=True, blank=True)
    session_id = models.CharField(max_length=128, blank=True, default="")
    query = models.TextField()
    kind = models.CharField(max_length=16, choices=RecallKind.choices)
    item_id = models.BigIntegerField()
    rank = models.PositiveSmallIntegerField()
    score = models.FloatField()
    mode = models.CharField(max_length=16)

    class Meta:
        db_table = "memory_recall_event"
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["kind", "item_id"], name="recall_event_item"),
            models.Index(fields=["user_id"], name="recall_event_user"),  # forgetting a person finds theirs
        ]

    def __str__(self):
        return f"{self.kind} {self.item_id} for {self.query[:40]!r}"


class Promotion(models.Model):
    """The promotion ledger: one row per memory made durable, so a
    sweep never promotes the same source twice (unique per source, kept after the facts it wrote)."""

    class Rule(models.TextChoices):
        SESSION_FACT = "session_fact", "Session fact to user fact"
        EPISODE = "episode", "Recurring episode to facts"

    source_kind = models.CharField(max_length=16, choices=RecallKind.choices)
    source_id = models.BigIntegerField()
    rule = models.CharField(max_length=16, choices=Rule.choices)
    # Whose memory it became: deleted with the person.
    user = models.ForeignKey(MemoryUser, null=True, blank=True, on_delete=models.CASCADE, related_name="promotions")
    agent_id = models.CharField(max_length=128, blank=True, default="")
    recalls = models.PositiveIntegerField()
    sessions = models.PositiveIntegerField()
    fact_ids = models.JSONField(default=list, blank=True)  # the facts written (created or confirmed)
    promoted_at = models.DateTimeField(db_index=True)

    class Meta:
        db_table = "memory_promotion"
        ordering = ["-promoted_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["source_kind", "source_id"], name="one_promotion_per_source"),
        ]

    def __str__(self):
        return f"{self.get_rule_display()}: {self.source_kind} {self.source_id}"


class Relation(models.TextChoices):
    SIMILAR = "similar", "Similar"  # a newly embedded memory and its closest ones of the same owner
    SUPPORTS = "supports", "Supports"  # a consolidated fact and the episode it came from
    CONTRADICTS = "contradicts", "Contradicts"  # a write that replaced a fact's value, to that value


class MemoryRelation(models.Model):
    """An edge of the memory graph from a recall document to another
    one, or, for `contradicts`, to the fact version whose value a write replaced (fact history).

    Deleting a memory deletes its document (a trigger), and a trigger on the documents deletes
    their edges with it (migration 0015), whoever deletes: the service, the admin, a cascade.
    Versions are deleted through the ORM (limits, erasure), which cascades to their edges.
    """

    source = models.ForeignKey(RecallDocument, on_delete=models.CASCADE, related_name="relations_out")
    target = models.ForeignKey(
        RecallDocument, null=True, blank=True, on_delete=models.CASCADE, related_name="relations_in"
    )
    target_version = models.ForeignKey(
        FactVersion, null=True, blank=True, on_delete=models.CASCADE, related_name="contradicted_by"
    )
    relation = models.CharField(max_length=16, choices=Relation.choices)
    weight = models.FloatField(default=1.0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "memory_relation"
        ordering = ["-weight", "id"]
        constraints = [
            models.UniqueConstraint(fields=["source", "target", "relation"], name="one_relation_per_pair"),
            models.UniqueConstraint(fields=["source", "target_version"], name="one_contradiction_per_version"),
            models.CheckConstraint(condition=~Q(source=F("target")), name="relation_not_to_itself"),
            models.CheckConstraint(
                condition=Q(relation=Relation.CONTRADICTS, target__isnull=True, target_version__isnull=False)
                | (~Q(relation=Relation.CONTRADICTS) & Q(target__isnull=False, target_version__isnull=True)),
                name="relation_has_one_target",
            ),
        ]

    def __str__(self):
        return f"{self.source_id} {self.relation} {self.target_id}"
