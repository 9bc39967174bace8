"""Workflows, and the Checkpoints and Reminders tabs on the /memories/ admin site (definitions are validated against the node registry on save)."""

import re

from django.contrib import admin, messages
from django.db.models import Sum
from django.urls import reverse
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.timezone import localtime

from memory.admin.tabs import MemoriesTab, memories_site
from memory.service import BatchDelete

from .conversations.checkpoints import (
    CHECKPOINT_ID_PATTERN,
    delete_checkpoints,
    head_checkpoint,
    thread_checkpoints,
    tracked_threads,
)
from .conversations.reminders import cancel_reminders, delete_reminders
from .conversations.threads import list_threads
from .models import Reminder, ReminderStatus, Thread, Workflow


@admin.register(Workflow, site=memories_site)
class WorkflowAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "is_active", "updated_at"]
    search_fields = ["slug", "name"]


# ------------------------------------------------------------------ the Checkpoints tab of /memories/
#
# Checkpoints are not Django rows, so the tab lists the tracked threads, one row per thread with its
# newest checkpoint (id, parent, step, source, blob size: one `get_tuple` per row on the page), and
# a thread's page lists all its checkpoints, 50 at a time, through the saver's public `list`. The
# search box filters by thread id (or user, conversation); `?user__id__exact=` and `?thread_id=`
# links narrow the tab to one user or thread. "Delete selected (N)" deletes the threads with all their
# checkpoints and pending writes: the saver cannot delete a single checkpoint through its public API.

CHECKPOINTS_PER_PAGE = 50


def _bytes(size):
    if size is None:
        return "–"
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KB"
    return f"{size / (1024 * 1024):.1f} MB"


@admin.register(Thread, site=memories_site)
class CheckpointsTab(MemoriesTab, admin.ModelAdmin):
    tab_label, tab_position = "Checkpoints", 30
    list_display = [
        "thread_id",
        "head_id",
        "head_parent",
        "head_step",
        "head_source",
        "head_blob_size",
        "checkpoint_count",
        "user_link",
        "last_activity",
    ]
    list_display_links = ["thread_id"]
    list_filter = ["workflow", "graph", "channel"]
    search_fields = ["thread_id", "conversation_id", "user__canonical_id", "user__display_name"]
    list_select_related = ["workflow", "user"]
    fields = [
        "thread_id",
        "user",
        "workflow",
        "graph",
        "conversation_id",
        "channel",
        "created_at",
        "last_activity",
        "checkpoint_count",
    ]
    readonly_fields = fields
    change_form_template = "admin/workflows/thread_change_form.html"

    def get_queryset(self, request):
        return tracked_threads()

    def lookup_allowed(self, lookup, value, request=None):
        # The user page links to "this user's threads"; a thread id narrows the tab to one thread.
        return lookup in {"user__id__exact", "thread_id"} or super().lookup_allowed(lookup, value, request)

    def has_change_permission(self, request, obj=None):
        return False  # threads are written by workflow runs; operators read and delete them

    def delete_memories(self, ids, actor=""):
        thread_ids = list(Thread.objects.filter(pk__in=ids).values_list("thread_id", flat=True))
        if not thread_ids:
            return BatchDelete(0, list(ids))
        return delete_checkpoints(thread_ids, actor=actor)

    def delete_summary(self, ids):
        total = Thread.objects.filter(pk__in=ids).aggregate(n=Sum("checkpoint_count"))["n"] or 0
        return [("checkpoints and their pending writes", total)] if total else []

    # --- the newest checkpoint of each listed thread, read once per row

    @staticmethod
    def _head(obj):
        if not hasattr(obj, "_head_checkpoint"):
            obj._head_checkpoint = head_checkpoint(obj.thread_id)
        return obj._head_checkpoint

    @admin.display(description="checkpoint id")
    def head_id(self, obj):
        head = self._head(obj)
        return head.checkpoint_id if head else "–"

    @admin.display(description="parent")
    def head_parent(self, obj):
        head = self._head(obj)
        return (head.parent_checkpoint_id or "–") if head else "–"

    @admin.display(description="step")
    def head_step(self, obj):
        head = self._head(obj)
        return head.step if head and head.step is not None else "–"

    @admin.display(description="source")
    def head_source(self, obj):
        head = self._head(obj)
        return format_html('<span class="badge">{}</span>', head.source) if head and head.source else "–"

    @admin.display(description="blob size")
    def head_blob_size(self, obj):
        head = self._head(obj)
        return _bytes(head.blob_size) if head else "–"

    @admin.display(description="user", ordering="user__display_name")
    def user_link(self, obj):
        url = reverse(f"{self.admin_site.name}:memory_memoryuser_change", args=[obj.user_id])
        return format_html('<a href="{}">{}</a>', url, obj.user.display_name or obj.user.canonical_id)

    # --- a thread's page: all its checkpoints, newest first, a page at a time

    def change_view(self, request, object_id, form_url="", extra_context=None):
        before = request.GET.get("before") or None
        if before is not None and not re.fullmatch(CHECKPOINT_ID_PATTERN, before):
            messages.error(request, "before: not a checkpoint id; showing the newest checkpoints.")
            before = None
        thread = self.get_object(request, object_id)
        extra_context = dict(extra_context or {})
        if thread is not None:
            rows = thread_checkpoints(thread.thread_id, limit=CHECKPOINTS_PER_PAGE + 1, before=before)
            page = rows[:CHECKPOINTS_PER_PAGE]
            extra_context.update(
                checkpoints=[(row, _bytes(row.blob_size)) for row in page],
                checkpoints_older=page[-1].checkpoint_id if len(rows) > CHECKPOINTS_PER_PAGE else None,
                checkpoints_before=before,
            )
        return super().change_view(request, object_id, form_url, extra_context)


def _user_threads(user):
    """The "Threads" section of a memory user's page: their conversation threads, linked to the Checkpoints tab."""
    site = memories_site.name
    rows = format_html_join(
        "",
        '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>',
        (
            (
                reverse(f"{site}:workflows_thread_change", args=[t.pk]),
                t.thread_id,
                t.source,
                t.channel or "–",
                t.checkpoint_count,
                date_format(localtime(t.last_activity), "DATETIME_FORMAT"),
            )
            for t in list_threads(user_ids=[user.pk])
        ),
    )
    all_url = reverse(f"{site}:workflows_thread_changelist") + "?" + urlencode({"user__id__exact": user.pk})
    return format_html(
        '<p><a href="{}">This user\'s threads in the Checkpoints tab</a></p>'
        '<table class="memories-section" id="user-threads"><thead><tr><th>thread id</th><th>workflow or graph</th>'
        "<th>channel</th><th>checkpoints</th><th>last activity</th></tr></thead><tbody>{}</tbody></table>",
        all_url,
        rows,
    )


memories_site.register_user_section("Threads", _user_threads)


# ------------------------------------------------------------------ the Reminders tab of /memories/


@admin.action(description="Cancel selected reminders")
def cancel_selected(modeladmin, request, queryset):
    """Cancel the selected reminders that are still pending (one being sent right now is left alone)."""
    result = cancel_reminders(queryset.order_by().values_list("pk", flat=True))
    text = f"Cancelled {result.cancelled} reminder{'' if result.cancelled == 1 else 's'}."
    if result.not_pending:
        text += f" {result.not_pending} were not pending (delivered, failed, cancelled, or being sent now)."
    modeladmin.message_user(request, text, messages.SUCCESS if result.cancelled else messages.WARNING)


@admin.register(Reminder, site=memories_site)
class RemindersTab(MemoriesTab, admin.ModelAdmin):
    """Reminders agents set with the `remind` tool: listed, filtered, cancelled and deleted by operators."""

    tab_label, tab_position = "Reminders", 48
    list_display = ["id", "message_preview", "user_link", "agent_id", "due_at", "status_badge", "attempts", "channel"]
    list_display_links = ["id", "message_preview"]
    list_filter = ["status", "channel", "agent_id", "due_at"]
    search_fields = ["message", "agent_id", "user__canonical_id", "user__display_name"]
    list_select_related = ["user"]
    actions = [cancel_selected, *MemoriesTab.actions]
    fields = [
        "user",
        "agent_id",
        "message",
        "due_at",
        "status",
        "attempts",
        "next_attempt_at",
        "last_error",
        "channel",
        "destination",
        "delivered_at",
        "claimed_by",
        "claimed_until",
        "created_at",
    ]
    readonly_fields = fields

    def lookup_allowed(self, lookup, value, request=None):
        return lookup == "user__id__exact" or super().lookup_allowed(lookup, value, request)

    def has_change_permission(self, request, obj=None):
        return False  # set by agents; operators cancel or delete them

    def delete_memories(self, ids, actor=""):
        return delete_reminders(ids)

    @admin.display(description="message")
    def message_preview(self, obj):
        return obj.message if len(obj.message) <= 80 else obj.message[:79] + "…"

    @admin.display(description="user", ordering="user__display_name")
    def user_link(self, obj):
        url = reverse(f"{self.admin_site.name}:memory_memoryuser_change", args=[obj.user_id])
        return format_html('<a href="{}">{}</a>', url, obj.user.display_name or obj.user.canonical_id)

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj):
        return format_html('<span class="badge badge-status-{}">{}</span>', obj.status, obj.get_status_display())


def _user_reminders(user):
    """The "Reminders" section of a memory user's page: their pending reminders, linked to the tab."""
    site = memories_site.name
    pending = Reminder.objects.filter(user=user, status=ReminderStatus.PENDING).order_by("due_at")[:50]
    rows = format_html_join(
        "",
        '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td></tr>',
        (
            (
                reverse(f"{site}:workflows_reminder_change", args=[r.pk]),
                r.message[:80],
                r.agent_id or "–",
                date_format(localtime(r.due_at), "DATETIME_FORMAT"),
            )
            for r in pending
        ),
    )
    all_url = reverse(f"{site}:workflows_reminder_changelist") + "?" + urlencode({"user__id__exact": user.pk})
    return format_html(
        '<p><a href="{}">All of this user\'s reminders in the Reminders tab</a></p>'
        '<table class="memories-section" id="user-reminders"><thead><tr><th>pending reminder</th><th>agent</th>'
        "<th>due</th></tr></thead><tbody>{}</tbody></table>",
        all_url,
        rows,
    )


memories_site.register_user_section("Reminders", _user_reminders)
