"""Models of the workflows app: workflow definitions and their runs, tracked conversation threads,
Telegram updates and replies, reminders."""

from django.db import models

from memory.models import MemoryUser, WorkspaceManager, workspace_field


class Workflow(models.Model):
    """A graph of registered node types, compiled into a LangGraph StateGraph to run.

    `definition` is {"nodes": [{"id", "type", "config"}], "edges": [{"source", "target", "when"?}]};
    see workflows.language.definition for the rules. It is validated against the node registry on every save.
    """

    workspace = workspace_field("workflows")
    slug = models.SlugField(max_length=100, unique=True)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    definition = models.JSONField(default=dict)
    is_active = models.BooleanField(default=True)
    # Counts saves through the API: a client sends the version it edited (If-Match) and a stale save
    # is refused instead of overwriting someone else's change.
    version = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = WorkspaceManager()

    class Meta:
        ordering = ["slug"]

    def __str__(self):
        return self.name or self.slug

    def clean(self):
        from .language.definition import validate_definition

        validate_definition(self.definition)

    def save(self, *args, **kwargs):
        from .language.definition import validate_definition

        validate_definition(self.definition)
        update_fields = kwargs.get("update_fields")
        bump = not self._state.adding and (update_fields is None or "version" in update_fields)
        if bump:  # in the statement: two saves at once make two versions, never one
            self.version = models.F("version") + 1
        super().save(*args, **kwargs)
        if bump:
            self.refresh_from_db(fields=["version"])


class Thread(models.Model):
    """A conversation kept by the checkpointer: one memory user, one conversation, one workflow or graph.

    A workflow's agent node tracks its threads; a graph of the developer's own (built in code on the
    shared checkpointer, see workflows.langgraph.conversation) is named by `graph` instead.

    The checkpoints themselves live in the saver; deleting a Thread row (directly, or through its
    user or workflow) deletes them through `saver.delete_thread` once the transaction commits.
    """

    workspace = workspace_field("threads")
    thread_id = models.CharField(max_length=300, unique=True)
    workflow = models.ForeignKey(Workflow, null=True, blank=True, on_delete=models.CASCADE, related_name="threads")
    # The name of a graph built in code (not a Workflow row); "" for a workflow's thread.
    graph = models.CharField(max_length=100, blank=True, default="")
    user = models.ForeignKey(MemoryUser, on_delete=models.CASCADE, related_name="threads")
    # "direct" for one-to-one conversations, else the group chat's id.
    conversation_id = models.CharField(max_length=100, default="direct")
    # The channel of the latest message in this thread.
    channel = models.CharField(max_length=50, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    last_activity = models.DateTimeField(db_index=True)
    checkpoint_count = models.PositiveIntegerField(default=0)
    # What the counted checkpoints take, as the saver's serializer encodes them: the measure of
    # WORKFLOWS["MAX_CHECKPOINT_BYTES_PER_USER"] over a person's threads.
    checkpoint_bytes = models.PositiveBigIntegerField(default=0)
    # The newest checkpoint counted, so each run counts only its own new checkpoints.
    head_checkpoint_id = models.CharField(max_length=100, blank=True, default="")

    objects = WorkspaceManager()

    class Meta:
        ordering = ["-last_activity", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["user", "workflow", "conversation_id"], name="one_thread_per_conversation"),
            models.UniqueConstraint(
                fields=["user", "graph", "conversation_id"],
                condition=models.Q(workflow__isnull=True),
                name="one_thread_per_graph_conversation",
            ),
            models.CheckConstraint(
                condition=models.Q(workflow__isnull=False, graph="")
                | (models.Q(workflow__isnull=True) & ~models.Q(graph="")),
                name="thread_of_a_workflow_or_a_graph",
            ),
        ]
        indexes = [models.Index(fields=["workflow", "-last_activity"], name="thread_workflow_recent")]

    def __str__(self):
        return self.thread_id

    @property
    def source(self):
        """What the conversation runs in: the workflow's slug, or "graph <name>"."""
        return self.workflow.slug if self.workflow_id else f"graph {self.graph}"


class UpdateStatus(models.TextChoices):
    RUNNING = "running", "running"
    DONE = "done", "done"


class TelegramUpdate(models.Model):
    """A Telegram update_id taken for a run: a claim while it runs, then the record that it finished.

    A retry of a finished update is acknowledged, not re-run. A running one is held by `claimed_by`
    (a server process) until `claimed_until`, which that process keeps renewing while it is alive; a
    claim whose lease ran out belongs to a process that died mid-run, and the next delivery of the
    update (Telegram's retry) takes it over and runs it (workflows.channels.claims).
    """

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="telegram_updates")
    update_id = models.BigIntegerField()
    received_at = models.DateTimeField(auto_now_add=True)
    status = models.CharField(max_length=10, choices=UpdateStatus.choices, default=UpdateStatus.RUNNING)
    claimed_by = models.CharField(max_length=100, blank=True, default="")
    claimed_until = models.DateTimeField(null=True, blank=True)
    # Runs started for this update: more than 1 when a process died mid-run and another took it over.
    attempts = models.PositiveIntegerField(default=1)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workflow", "update_id"], name="one_run_per_telegram_update"),
        ]


class ReplyStatus(models.TextChoices):
    PENDING = "pending", "pending"
    SENT = "sent", "sent"
    FAILED = "failed", "failed"


class TelegramReply(models.Model):
    """The outbox: a run's reply, written in the transaction that records the run as finished.

    Sent after that commit (never inside a transaction) by the request that ran the update, else by a
    later delivery of the update or the delivery worker (`manage.py memory reminders`), which claim it
    with a lease as reminders are claimed (workflows.channels.outbox). One per update. Its text is cleared once
    the Bot API has accepted it; a pending one goes with its person when they are forgotten.
    """

    update = models.OneToOneField(TelegramUpdate, on_delete=models.CASCADE, related_name="reply")
    # The memory user the run was for; no database constraint, so a person forgotten mid-run does not
    # fail the run's completion (their pending replies are deleted with them through users_deleting).
    user = models.ForeignKey(
        MemoryUser, null=True, blank=True, on_delete=models.CASCADE, db_constraint=False, related_name="+"
    )
    chat_id = models.CharField(max_length=64, blank=True, default="")
    text = models.TextField(blank=True, default="")
    callback_query_id = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=10, choices=ReplyStatus.choices, default=ReplyStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    claimed_by = models.CharField(max_length=100, blank=True, default="")
    claimed_until = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="telegram_reply_due")]

    def __str__(self):
        return f"reply to update {self.update_id}"


class ReminderStatus(models.TextChoices):
    PENDING = "pending", "pending"
    DELIVERED = "delivered", "delivered"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


class Reminder(models.Model):
    """A message an agent promised to send its user later (the `remind` tool), and how its delivery went.

    Delivery (workflows.channels.delivery) claims due rows with a lease (`claimed_by`, `claimed_until`), sends
    them through the channel of the conversation they were set in (else the one the user last used), and
    records the outcome: `delivered`, or a retry at `next_attempt_at` after a failure, or `failed` with
    `last_error` once the attempts are used up. `channel` and `destination` are filled when it is sent.
    `thread_id`: the conversation thread the reminder was set in; a sent reminder is written into it.
    """

    user = models.ForeignKey(MemoryUser, on_delete=models.CASCADE, related_name="reminders")
    agent_id = models.CharField(max_length=128, blank=True, default="")
    message = models.TextField()
    due_at = models.DateTimeField()
    status = models.CharField(max_length=20, choices=ReminderStatus.choices, default=ReminderStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    # When a worker may take it next: due_at at first, later after a failed attempt's backoff.
    next_attempt_at = models.DateTimeField()
    claimed_by = models.CharField(max_length=100, blank=True, default="")
    claimed_until = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    channel = models.CharField(max_length=50, blank=True, default="")
    destination = models.CharField(max_length=255, blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    thread_id = models.CharField(max_length=300, blank=True, default="")

    # Of the workspace of its user (memory.models.workspaces).
    workspace_through = "user"
    objects = WorkspaceManager()

    class Meta:
        ordering = ["due_at", "id"]
        indexes = [
            # What a worker's claim reads: pending rows by when they may be taken.
            models.Index(fields=["status", "next_attempt_at"], name="reminder_due"),
            models.Index(fields=["user", "status"], name="reminder_user_status"),
        ]
        constraints = [
            models.CheckConstraint(condition=~models.Q(message=""), name="reminder_message_not_blank"),
        ]

    def __str__(self):
        return f"reminder #{self.pk}"


class RunStatus(models.TextChoices):
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"


class WorkflowRun(models.Model):
    """One run of a workflow, kept so a reload or another operator sees it: who it was for, what each
    node read and returned (`events`, as the run's event stream sent them), the reply, errors and timings.

    `user` is the memory user identify_user found (null until then, or when it could not); forgetting
    that person deletes their runs (workflows.graph.runs), and runs nobody was identified for by the
    identity they came from.
    """

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="runs")
    workflow_version = models.PositiveIntegerField()
    # The trigger type (telegram, chat, webhook, manual) and its payload as given.
    trigger = models.CharField(max_length=20)
    input = models.JSONField(default=dict)
    # Who sent it, as the trigger named them: what forgetting a person matches when no user was found.
    channel = models.CharField(max_length=50, blank=True, default="")
    external_id = models.CharField(max_length=255, blank=True, default="")
    user = models.ForeignKey(MemoryUser, null=True, blank=True, on_delete=models.CASCADE, related_name="workflow_runs")
    thread_id = models.CharField(max_length=300, blank=True, default="")
    events = models.JSONField(default=list)
    reply = models.TextField(blank=True, default="")
    errors = models.JSONField(default=list)
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.RUNNING)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)

    # Of the workspace of its workflow (memory.models.workspaces).
    workspace_through = "workflow"
    objects = WorkspaceManager()

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [
            models.Index(fields=["workflow", "-started_at"], name="run_workflow_recent"),
            models.Index(fields=["channel", "external_id"], name="run_sender"),
        ]

    def __str__(self):
        return f"run #{self.pk} of {self.workflow_id}"
