"""Records about the memory, not memories: consolidation runs, deletions' audit records, tombstones of
forgotten people."""

from django.db import models


class ConsolidationRun(models.Model):
    """One consolidation pass over unprocessed episodes: what it took, what it stored, what failed.

    An operational record (shown on /healthz as the last consolidation), not memory: export and
    clear leave it alone.
    """

    started_at = models.DateTimeField(db_index=True)
    finished_at = models.DateTimeField()
    extractor = models.CharField(max_length=200)
    agent_id = models.CharField(max_length=128, blank=True, default="", help_text="Blank: every agent.")
    episodes_seen = models.PositiveIntegerField(default=0)
    episodes_processed = models.PositiveIntegerField(default=0)
    episodes_failed = models.PositiveIntegerField(default=0)
    facts_created = models.PositiveIntegerField(default=0)
    facts_confirmed = models.PositiveIntegerField(default=0)
    facts_updated = models.PositiveIntegerField(default=0)
    facts_skipped = models.PositiveIntegerField(default=0)
    errors = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]

    @property
    def ok(self):
        return self.episodes_failed == 0

    def __str__(self):
        return f"Consolidation {self.pk} at {self.started_at:%Y-%m-%d %H:%M}"


# ------------------------------------------------------------------ recall index (hybrid recall)


class DeletionKind(models.TextChoices):
    FACTS = "facts"
    EPISODES = "episodes"
    PROCEDURES = "procedures"
    MEMORY_USERS = "memory users"
    THREADS = "threads"
    STORE_ITEMS = "store items"


class DeletionRecord(models.Model):
    """An audit record of one deletion: who, when, what kind, how many, which ids — never whose.

    Written in the deletion's own transaction by every path that deletes memory (service, REST, admin,
    commands). It names rows by id only: a record of forgetting a person must not remember them.
    """

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    # "admin:<username>", "api:<username>", "command", "workflow", or what the caller passed.
    actor = models.CharField(max_length=200)
    kind = models.CharField(max_length=20, choices=DeletionKind.choices)
    count = models.PositiveIntegerField()
    ids = models.JSONField(default=list)
    # With a person's deletion: how much went with them ({"facts": 4, "threads": 1, ...}).
    cascaded = models.JSONField(default=dict, blank=True)

    class Meta:
        db_table = "memory_deletion_record"
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.count} {self.kind} by {self.actor}"


class Tombstone(models.Model):
    """What is kept of a forgotten person: ids and keyed hashes, never a name (memory/operations/tombstones.py).

    One row per memory user id (`digest` of the id) and one per channel identity they had (`digest`
    of channel and external id), so an import of an export from before the forget can recognise them.
    """

    forgotten_id = models.BigIntegerField(db_index=True)  # the memory user id they had
    digest = models.CharField(max_length=64, unique=True)
    forgotten_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "memory_tombstone"
        ordering = ["-forgotten_at", "-id"]

    def __str__(self):
        return f"forgotten memory user {self.forgotten_id}"


class HealthSnapshot(models.Model):
    """One day's memory health of one agent (agent_id blank: the whole memory), as `memory health
    --snapshot` took it (the last run of a day replaces that day's). Kept HEALTH["SNAPSHOT_DAYS"] days.
    An operational record, not memory: export and clear leave it alone."""

    agent_id = models.CharField(max_length=128, blank=True, default="")
    day = models.DateField()
    score = models.FloatField(null=True, blank=True)
    band = models.CharField(max_length=16)
    metrics = models.JSONField(default=dict, blank=True)
    taken_at = models.DateTimeField()

    class Meta:
        db_table = "memory_health_snapshot"
        ordering = ["agent_id", "day"]
        constraints = [models.UniqueConstraint(fields=["agent_id", "day"], name="one_health_snapshot_per_agent_day")]

    def __str__(self):
        return f"health of {self.agent_id or 'all agents'} on {self.day}: {self.band}"


class EmbeddingClaim(models.Model):
    """A worker's lease on a text waiting for its vector (memory/recall/claims.py).

    Brokers deliver a task at least once and several workers drain the same backlog, so who embeds a
    document is decided here, in the database: one row per claimed document, unique, taken over once
    `claimed_until` has passed (the worker that held it died). The row goes when the vector is stored.
    """

    # "recall" (memory_recall_doc) or "store" (EngramStore items): the table of `row_id`.
    source = models.CharField(max_length=16)
    row_id = models.BigIntegerField()
    claimed_by = models.CharField(max_length=100)
    claimed_until = models.DateTimeField()

    class Meta:
        db_table = "memory_embedding_claim"
        constraints = [models.UniqueConstraint(fields=["source", "row_id"], name="one_embedding_claim_per_row")]
        indexes = [models.Index(fields=["claimed_by"], name="embedding_claim_by")]


class PeriodicRun(models.Model):
    """One row per periodic job and period that ran (memory/tasks.py): a second scheduler (another
    beat, another machine) finds the row there and skips that period."""

    name = models.CharField(max_length=100)
    period_start = models.DateTimeField()
    started_by = models.CharField(max_length=100)
    started_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "memory_periodic_run"
        constraints = [models.UniqueConstraint(fields=["name", "period_start"], name="one_run_per_period")]


class ArchivedEpisode(models.Model):
    """An episode compaction folded into a summary episode (memory/learning/compaction.py): kept, out of recall.

    `episode_id` is the id it had; `record` holds its columns as they were (JSON). The summary it went
    into is `summary_episode` (cleared if that is deleted). A person forgotten takes theirs with them.
    """

    episode_id = models.BigIntegerField(unique=True)
    agent_id = models.CharField(max_length=128, blank=True, default="", db_index=True)
    user = models.ForeignKey(
        "memory.MemoryUser", null=True, blank=True, on_delete=models.CASCADE, related_name="archived_episodes"
    )
    summary_episode = models.ForeignKey(
        "memory.Episode", null=True, blank=True, on_delete=models.SET_NULL, related_name="archived"
    )
    started_at = models.DateTimeField()
    record = models.JSONField(default=dict)
    archived_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "memory_archived_episode"
        ordering = ["-started_at", "-id"]

    def __str__(self):
        return f"archived episode {self.episode_id}"
