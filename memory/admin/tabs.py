"""The tabs of the /memories/ admin site (memory/admin/site.py): facts, episodes, procedures, users, deletions."""

import json

from django.contrib import admin, messages
from django.db.models.fields.json import KT
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import mark_safe

from ..exceptions import InvalidMemoryArgument, MemoryNotFound
from ..models import ChannelIdentity, DeletionRecord, Episode, Fact, MemoryUser, Procedure, Promotion, StoreItem
from ..service import MemoryService
from . import actions
from .actions import owner_label
from .concepts import ConceptFilter
from .site import (
    FactForm,
    MemoriesTab,
    badge,
    duration,
    memories_site,
    percent,
    truncate,
)

__all__ = ["MemoriesTab", "memories_site"]


def relations_html(site, kind, obj):
    """A memory's edges of the memory graph as links, strongest first: "supports → episode 7 (1.00)"
    for an edge from this memory, "similar ← fact 12 (0.91)" for one to it."""
    if obj is None or obj.pk is None:
        return "–"
    edges = MemoryService().memory_relations(kind, obj.pk)
    if not edges:
        return "none"
    lines = []
    for direction, relation, weight, other_kind, other_id in edges:
        arrow = "→" if direction == "to" else "←"
        if other_kind == "fact_version":  # the replaced value: shown in the fact's history below
            lines.append(format_html("{} {} version {} of the history", relation, arrow, other_id))
            continue
        url = reverse(f"{site.name}:memory_{other_kind}_change", args=[other_id])
        lines.append(
            format_html(
                '{} {} <a href="{}">{} {}</a> ({})', relation, arrow, url, other_kind, other_id, f"{weight:.2f}"
            )
        )
    return format_html_join(mark_safe("<br>"), "{}", ((line,) for line in lines))


@admin.register(Fact, site=memories_site)
class FactAdmin(MemoriesTab, admin.ModelAdmin):
    tab_label, tab_position = "Facts", 10
    list_display = [
        "key",
        "short_value",
        "owner",
        "scope_badge",
        "type_badge",
        "confidence_percent",
        "pinned",
        "last_accessed",
        "updated_at",
    ]
    list_display_links = ["key"]
    list_filter = ["scope", "team", "fact_type", "pinned", ConceptFilter]
    actions = [actions.delete_memories, actions.pin_memories, actions.unpin_memories]
    list_select_related = ["user", "team"]
    search_fields = ["key", "search_text", "agent_id", "session_id"]
    # Key and owner are what the fact is: an edit changes only what it says (through the service).
    form = FactForm
    fields = [
        "key",
        "owner",
        "value",
        "fact_type",
        "confidence",
        "pinned",
        "tags",
        "times_confirmed",
        "times_contradicted",
        "source_episode",
        "provenance",
        "access_count",
        "last_accessed",
        "created_at",
        "updated_at",
        "relations",
        "history",
    ]
    readonly_fields = [
        "key",
        "owner",
        "pinned",
        "tags",
        "history",
        "times_confirmed",
        "times_contradicted",
        "source_episode",
        "provenance",
        "access_count",
        "last_accessed",
        "created_at",
        "updated_at",
        "relations",
    ]

    def get_queryset(self, request):
        return MemoryService().fact_list()

    def save_model(self, request, obj, form, change):
        """Through MemoryService.edit_fact: checked, re-indexed, re-embedded like every write."""
        data = form.cleaned_data
        saved = MemoryService().edit_fact(
            obj.pk, value=data["value"], confidence=data["confidence"], fact_type=data["fact_type"]
        )
        obj.__dict__.update(
            {k: getattr(saved, k) for k in ("value", "confidence", "fact_type", "updated_at", "provenance")}
        )

    @admin.display(description="owner")
    def owner(self, obj):
        return owner_label(obj)

    HISTORY_SHOWN = 50

    @admin.display(description="history")
    def history(self, obj):
        """The fact's latest versions, oldest first (`manage.py memory history <id>` shows them all)."""
        if obj is None or obj.pk is None:
            return ""
        versions = MemoryService().fact_history(obj.pk, limit=self.HISTORY_SHOWN)
        if not versions:
            return "no versions kept"
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    v.valid_from.strftime("%Y-%m-%d %H:%M:%S"),
                    v.action,
                    truncate(v.value),
                    percent(v.confidence),
                    v.provenance,
                    v.source_episode_id or "",
                )
                for v in versions
            ),
        )
        return format_html(
            '<table class="fact-history"><thead><tr><th>valid from</th><th>action</th><th>value</th>'
            "<th>confidence</th><th>provenance</th><th>episode</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    def lookup_allowed(self, lookup, value, request=None):
        # The user page links to "this user's facts" (?user__id__exact=<id>).
        return lookup == "user__id__exact" or super().lookup_allowed(lookup, value, request)

    def delete_memories(self, ids, actor=""):
        return MemoryService().delete_facts(ids, actor=actor)

    @admin.display(description="related memories")
    def relations(self, obj):
        return relations_html(self.admin_site, "fact", obj)

    @admin.display(description="value")
    def short_value(self, obj):
        return truncate(obj.value)

    @admin.display(description="scope", ordering="scope")
    def scope_badge(self, obj):
        return badge("scope", obj.scope)

    @admin.display(description="type", ordering="fact_type")
    def type_badge(self, obj):
        return badge("type", obj.fact_type, obj.get_fact_type_display())

    @admin.display(description="confidence", ordering="confidence")
    def confidence_percent(self, obj):
        return percent(obj.confidence)


@admin.register(Episode, site=memories_site)
class EpisodeAdmin(MemoriesTab, admin.ModelAdmin):
    tab_label, tab_position = "Episodes", 20
    list_display = ["id", "owner", "agent_id", "trigger_type", "success", "short_summary", "started_at", "duration"]
    list_select_related = ["user"]
    list_filter = ["success", "trigger_type", "processed_for_facts", ConceptFilter]
    search_fields = ["agent_id", "summary", "workflow", "session_id"]
    readonly_fields = ["started_at", "ended_at", "duration_ms", "relations"]
    raw_id_fields = ["user"]

    @admin.display(description="related memories")
    def relations(self, obj):
        return relations_html(self.admin_site, "episode", obj)

    def get_queryset(self, request):
        episodes = MemoryService().episode_list()
        match = getattr(request, "resolver_match", None)
        if match is not None and match.url_name and match.url_name.endswith("_changelist"):
            # The list shows none of the large JSON columns; leave them in the database.
            episodes = episodes.defer("trigger_input", "conversation", "actions", "final_output")
            # Shown when there is no summary; read in the database, not by loading the conversation.
            episodes = episodes.annotate(
                first_role=KT("conversation__0__role"), first_message=KT("conversation__0__content")
            )
        return episodes

    def lookup_allowed(self, lookup, value, request=None):
        return lookup == "user__id__exact" or super().lookup_allowed(lookup, value, request)

    @admin.display(description="owner")
    def owner(self, obj):
        return owner_label(obj)

    def delete_memories(self, ids, actor=""):
        return MemoryService().delete_episodes(ids, actor=actor)

    @admin.display(description="summary")
    def short_summary(self, obj):
        if obj.summary:
            return truncate(obj.summary, 80)
        # A workflow's episode records its conversation, not a summary of it: its first message.
        first = getattr(obj, "first_message", None)
        return truncate(f"{obj.first_role}: {first}", 80) if first else ""

    @admin.display(description="duration", ordering="duration_ms")
    def duration(self, obj):
        return duration(obj.duration_ms)


@admin.register(Procedure, site=memories_site)
class ProcedureAdmin(MemoriesTab, admin.ModelAdmin):
    tab_label, tab_position = "Procedures", 40
    list_display = ["name", "agent", "type_badge", "times_used", "success_percent", "is_active", "pinned"]
    list_filter = ["procedure_type", "is_active", "source", "pinned"]
    search_fields = ["name", "description", "agent_id"]
    actions = [actions.delete_memories, actions.pin_memories, actions.unpin_memories]
    readonly_fields = [
        "pinned",
        "times_used",
        "times_succeeded",
        "times_failed",
        "success_rate",
        "avg_duration_ms",
        "last_used",
        "created_at",
        "updated_at",
    ]
    raw_id_fields = ["parent"]

    def get_queryset(self, request):
        return MemoryService().procedure_list()

    def delete_memories(self, ids, actor=""):
        return MemoryService().delete_procedures(ids, actor=actor)

    @admin.display(description="agent", ordering="agent_id")
    def agent(self, obj):
        return obj.agent_id or "(shared)"

    @admin.display(description="type", ordering="procedure_type")
    def type_badge(self, obj):
        return badge("type", obj.procedure_type, obj.get_procedure_type_display())

    @admin.display(description="success rate", ordering="success_rate")
    def success_percent(self, obj):
        return percent(obj.success_rate) if obj.times_used else "–"


@admin.register(StoreItem, site=memories_site)
class StoreItemAdmin(MemoriesTab, admin.ModelAdmin):
    """Items LangGraph graphs keep through EngramStore, by namespace; read and delete only."""

    tab_label, tab_position = "Store", 45
    list_display = ["namespace", "key", "owner", "value_preview", "updated_at", "expires_at"]
    list_filter = ["scope"]
    search_fields = ["namespace", "key", "text"]
    list_select_related = ["user"]
    fields = ["namespace", "key", "value", "scope", "user", "agent_id", "created_at", "updated_at", "expires_at"]
    readonly_fields = fields

    def get_queryset(self, request):
        return MemoryService().store_item_list()

    def delete_memories(self, ids, actor=""):
        return MemoryService().delete_store_items(ids, actor=actor)

    def lookup_allowed(self, lookup, value, request=None):
        # A memory user's page links to "this user's store items".
        return lookup == "user__id__exact" or super().lookup_allowed(lookup, value, request)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False  # written by graphs; operators read and delete them

    @admin.display(description="owner", ordering="scope")
    def owner(self, obj):
        return owner_label(obj)

    @admin.display(description="value")
    def value_preview(self, obj):
        return truncate(json.dumps(obj.value, ensure_ascii=False), 80)


class ChannelIdentityInline(admin.TabularInline):
    model = ChannelIdentity
    extra = 0
    fields = ["channel", "external_id", "created_at"]
    readonly_fields = ["channel", "external_id", "created_at"]
    can_delete = False

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


SECTION_ROWS = 50


@admin.register(MemoryUser, site=memories_site)
class MemoryUserAdmin(MemoriesTab, admin.ModelAdmin):
    tab_label, tab_position = "Users", 50
    list_display = ["name", "canonical_id", "identity_list", "email", "total_conversations", "last_seen"]
    list_display_links = ["name", "canonical_id"]
    list_filter = ["identities__channel"]
    search_fields = ["display_name", "canonical_id", "identities__external_id"]
    fields = [
        "display_name",
        "canonical_id",
        "total_conversations",
        "merged_into",
        "merged_at",
        "created_at",
        "last_seen",
        "memory_sections",
    ]
    readonly_fields = [
        "canonical_id",
        "total_conversations",
        "merged_into",
        "merged_at",
        "created_at",
        "last_seen",
        "memory_sections",
    ]
    inlines = [ChannelIdentityInline]
    actions = [actions.delete_memories, actions.merge_users]
    change_form_template = "admin/memories/memoryuser_change_form.html"

    def get_queryset(self, request):
        return MemoryService().memory_user_list()

    def delete_memories(self, ids, actor=""):
        return MemoryService().delete_users(ids, cascade=True, actor=actor)

    def delete_summary(self, ids):
        footprint = MemoryService().user_footprint(ids)
        return [(what.replace("_", " "), n) for what, n in footprint.items() if n]

    def get_urls(self):
        opts = self.model._meta
        return [
            path(
                "<int:object_id>/merge/",
                self.admin_site.admin_view(self.merge_view),
                name=f"{opts.app_label}_{opts.model_name}_merge",
            ),
            *super().get_urls(),
        ]

    def merge_view(self, request, object_id):
        """Merge this user into another one (the detail page's "Merge into…" button)."""
        service = MemoryService()
        try:
            user = service.resolve_user(object_id)
        except MemoryNotFound:
            return self._get_obj_does_not_exist_redirect(request, self.model._meta, str(object_id))
        error = None
        target_value = request.POST.get("target", "")
        if request.method == "POST":
            try:
                target_id = int(target_value)
                target = service.merge_users(user.pk, target_id)
            except (InvalidMemoryArgument, MemoryNotFound) as exc:  # before ValueError: a subclass of it
                error = str(exc)
            except ValueError:
                error = "target: enter the id of the memory user to merge into"
            else:
                self.message_user(request, f"Merged {user} into {target}.", messages.SUCCESS)
                return HttpResponseRedirect(
                    reverse(f"{self.admin_site.name}:memory_memoryuser_change", args=[target.pk])
                )
        context = {
            **self.admin_site.each_context(request),
            "title": f"Merge {user} into another user",
            "opts": self.model._meta,
            "user_to_merge": user,
            "target_value": target_value,
            "error": error,
        }
        return TemplateResponse(request, "admin/memories/merge_user.html", context)

    @admin.display(description="name", ordering="display_name")
    def name(self, obj):
        return obj.display_name or "–"

    @admin.display(description="identities")
    def identity_list(self, obj):
        return ", ".join(str(i) for i in obj.identities.all())

    @admin.display(description="email")
    def email(self, obj):
        return next((i.external_id for i in obj.identities.all() if i.channel == "email"), "–")

    @admin.display(description="memories")
    def memory_sections(self, obj):
        """The user's facts, episodes and the sections other apps register (threads)."""
        if obj is None or obj.pk is None:
            return "–"
        service = MemoryService()
        footprint = service.user_footprint([obj.pk])
        facts_url = (
            reverse(f"{self.admin_site.name}:memory_fact_changelist") + "?" + urlencode({"user__id__exact": obj.pk})
        )
        episodes_url = (
            reverse(f"{self.admin_site.name}:memory_episode_changelist") + "?" + urlencode({"user__id__exact": obj.pk})
        )
        fact_rows = format_html_join(
            "",
            '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td></tr>',
            (
                (
                    reverse(f"{self.admin_site.name}:memory_fact_change", args=[f.pk]),
                    f.key,
                    truncate(f.value),
                    f.fact_type,
                    percent(f.confidence),
                )
                for f in service.user_facts(obj.pk, limit=SECTION_ROWS)
            ),
        )
        episode_rows = format_html_join(
            "",
            '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>',
            (
                (
                    reverse(f"{self.admin_site.name}:memory_episode_change", args=[e.pk]),
                    e.pk,
                    e.agent_id,
                    e.trigger_type,
                    e.success,
                    truncate(e.summary, 80),
                )
                for e in service.recent_episodes(user_id=obj.pk, limit=SECTION_ROWS)
            ),
        )
        parts = [
            format_html(
                '<h3 id="user-facts">Facts ({})</h3><p><a href="{}">All facts of this user</a></p>'
                '<table class="memories-section"><thead><tr><th>key</th><th>value</th><th>type</th><th>confidence</th></tr></thead><tbody>{}</tbody></table>',
                footprint["facts"],
                facts_url,
                fact_rows,
            ),
            format_html(
                '<h3 id="user-episodes">Episodes ({})</h3><p><a href="{}">All episodes of this user</a></p>'
                '<table class="memories-section"><thead><tr><th>id</th><th>agent</th><th>trigger</th><th>success</th><th>summary</th></tr></thead><tbody>{}</tbody></table>',
                footprint["episodes"],
                episodes_url,
                episode_rows,
            ),
        ]
        for section in self.admin_site.user_sections:
            parts.append(format_html("<h3>{}</h3>{}", section.title, section.render(obj)))
        if not self.admin_site.user_sections:
            parts.append(
                format_html("<h3>{}</h3><p>{}</p>", "Threads", "No conversation threads are tracked on this site.")
            )
        return format_html_join("", "{}", ((p,) for p in parts))


@admin.register(Promotion, site=memories_site)
class PromotionAdmin(MemoriesTab, admin.ModelAdmin):
    """The promotion ledger (memory/learning/promotion.py): what recall made durable, once each. Read only;
    a person's rows go with the person."""

    tab_label, tab_position = "Promotions", 85
    list_display = ["promoted_at", "rule", "source", "user", "agent_id", "recalls", "sessions", "fact_ids"]
    list_filter = ["rule", "source_kind"]
    search_fields = ["agent_id"]
    fields = ["promoted_at", "rule", "source_kind", "source_id", "user", "agent_id", "recalls", "sessions", "fact_ids"]
    readonly_fields = fields
    actions = []

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # a ledger entry is what keeps the source from being promoted twice

    def delete_memories(self, ids, actor=""):
        raise PermissionError("promotion ledger entries are not deleted by hand")

    def delete_summary(self, ids):
        return []

    @admin.display(description="source")
    def source(self, obj):
        return f"{obj.source_kind} {obj.source_id}"


@admin.register(DeletionRecord, site=memories_site)
class DeletionRecordAdmin(MemoriesTab, admin.ModelAdmin):
    """The audit trail of deletions: read only, and it names no person (ids and counts only)."""

    tab_label, tab_position = "Deletions", 90
    list_display = ["created_at", "actor", "kind", "count", "cascaded_counts"]
    list_filter = ["kind"]
    search_fields = ["actor"]
    fields = ["created_at", "actor", "kind", "count", "ids", "cascaded"]
    readonly_fields = fields
    actions = []

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # an audit trail is not edited

    def delete_memories(self, ids, actor=""):
        raise PermissionError("deletion records are not deleted")

    def delete_summary(self, ids):
        return []

    @admin.display(description="with them")
    def cascaded_counts(self, obj):
        return ", ".join(f"{n} {what.replace('_', ' ')}" for what, n in (obj.cascaded or {}).items() if n) or "–"
