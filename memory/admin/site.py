"""The /memories/ admin site and what its tabs share (memory/admin/tabs.py registers the tabs): staff browse and delete what agents remember, one tab per kind of memory.

The index is five tabs (Facts, Episodes, Checkpoints, Procedures, Users), each the change list of its
ModelAdmin. A tab remembers its own page, filters and search in the session, so switching tabs never
loses another tab's place. Reads come from `MemoryService` querysets; deletes and merges go through
`MemoryService` (see memory/admin/actions.py). Other apps add tabs with `memories_site.register(...)` and a
ModelAdmin that mixes in `MemoriesTab` (the conversation checkpoints tab lives in workflows/admin.py),
and add sections to a memory user's page with `memories_site.register_user_section(...)`.
"""

import functools
import json
from dataclasses import dataclass

from django import forms
from django.contrib import admin
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html

from ..exceptions import InvalidMemoryArgument
from ..models import (
    Fact,
)
from ..models.workspaces import enter_workspace, workspace_of_user
from ..rules import validation
from . import actions
from .actions import confirmation_label

TAB_STATE_SESSION_KEY = "memories_tabs"


@dataclass(frozen=True)
class Tab:
    """One tab of the index: its label, the change list URL (with the tab's remembered query)."""

    label: str
    model: str  # "app_label.model_name"
    url: str


@dataclass(frozen=True)
class UserSection:
    """A block on a memory user's detail page, rendered by `render(user) -> safe HTML`."""

    title: str
    render: object


class MemoriesAdminSite(admin.AdminSite):
    site_header = "Engram memories"
    site_title = "Engram"
    index_title = "What agents remember"
    enable_nav_sidebar = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._user_sections = []
        # Bulk deletes go through MemoryService (memory/admin/actions.py), never Django's per-object collector.
        self.disable_action("delete_selected")

    def register_user_section(self, title, render):
        """Show `render(user)` (safe HTML) under `title` on every memory user's detail page."""
        self._user_sections.append(UserSection(title, render))

    @property
    def user_sections(self):
        return list(self._user_sections)

    def tabs(self, request):
        """The tabs, ordered by each tab ModelAdmin's `tab_position`, each with its remembered query."""
        state = request.session.get(TAB_STATE_SESSION_KEY, {}) if hasattr(request, "session") else {}
        entries = []
        for model, model_admin in self._registry.items():
            if not isinstance(model_admin, MemoriesTab):
                continue
            label = model._meta.label_lower
            url = reverse(f"{self.name}:{model._meta.app_label}_{model._meta.model_name}_changelist")
            query = state.get(label, "")
            entries.append(
                (model_admin.tab_position, Tab(model_admin.tab_label, label, f"{url}?{query}" if query else url))
            )
        return [tab for _, tab in sorted(entries, key=lambda e: e[0])]

    def each_context(self, request):
        context = super().each_context(request)
        if getattr(request, "user", None) is not None and request.user.is_active and request.user.is_staff:
            context["memories_tabs"] = self.tabs(request)
        return context

    def index(self, request, extra_context=None):
        """The index is the tab view: open the first tab, where the operator left it."""
        tabs = self.tabs(request)
        if not tabs:
            return super().index(request, extra_context)
        return HttpResponseRedirect(tabs[0].url)

    def has_permission(self, request):
        return request.user.is_active and request.user.is_staff

    def admin_view(self, view, cacheable=False):
        """Every page of the site works in the staff user's workspace: each tab's change list, forms
        and actions see that workspace's rows only (memory.models.workspaces)."""
        protected = super().admin_view(view, cacheable)

        @functools.wraps(view)
        def in_users_workspace(request, *args, **kwargs):
            if request.user.is_active and request.user.is_staff:
                enter_workspace(workspace_of_user(request.user))
            return protected(request, *args, **kwargs)

        return in_users_workspace


memories_site = MemoriesAdminSite(name="memories")


def admin_actor(request):
    """Who deletes, for the audit record."""
    return f"admin:{request.user.get_username()}"


class MemoriesTab:
    """Mixin for a ModelAdmin shown as a tab of the /memories/ index.

    Staff may view, change and delete (nobody adds memories by hand: agents write them). Deletes
    from the detail page and the bulk action call `delete_memories(ids)`, which the tab provides
    through MemoryService.
    """

    tab_label = ""
    tab_position = 100
    list_per_page = 50
    list_max_show_all = 500
    actions = [actions.delete_memories]
    change_list_template = "admin/memories/change_list.html"

    def delete_memories(self, ids, actor=""):
        """Delete these ids through the service (`actor` for its audit record); returns memory.service.BatchDelete."""
        raise NotImplementedError(f"{type(self).__name__} must provide delete_memories(ids, actor)")

    # --- the admin log: no person's name in it (the deletion itself is audited as a DeletionRecord)

    def log_addition(self, request, obj, message):
        return self._log(request, obj, ADDITION, message)

    def log_change(self, request, obj, message):
        return self._log(request, obj, CHANGE, message)

    def log_deletions(self, request, queryset):
        """Nothing: MemoryService writes the DeletionRecord (who, when, which ids), and a log entry
        would keep the deleted person's name in django_admin_log (its object_repr is str(obj))."""
        return []

    def _log(self, request, obj, flag, message):
        return LogEntry.objects.create(
            user_id=request.user.pk,
            content_type=ContentType.objects.get_for_model(obj, for_concrete_model=False),
            object_id=str(obj.pk),
            object_repr=f"{obj._meta.verbose_name} #{obj.pk}",  # never str(obj): it may name a person
            action_flag=flag,
            change_message=json.dumps(message) if isinstance(message, list) else message,
        )

    def delete_summary(self, ids):
        """Extra lines for the confirmation page: what else goes with these rows."""
        return []

    # --- permissions: every active staff member, nobody else

    def has_module_permission(self, request):
        return request.user.is_active and request.user.is_staff

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff

    def has_change_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff

    def has_delete_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff

    def has_add_permission(self, request):
        return False

    # --- the tab's own place: page, filters and search, kept per tab in the session

    def changelist_view(self, request, extra_context=None):
        if request.method != "GET":
            return super().changelist_view(request, extra_context)
        label = self.model._meta.label_lower
        state = request.session.get(TAB_STATE_SESSION_KEY, {})
        before = state.get(label)
        # Saved before rendering, so this page's own tab link carries its state too.
        self._save_tab_state(request, label, request.GET.urlencode())
        response = super().changelist_view(request, extra_context)
        if getattr(response, "status_code", 200) != 200:  # e.g. bad filters: keep the last good state
            self._save_tab_state(request, label, before)
        return response

    @staticmethod
    def _save_tab_state(request, label, query):
        state = request.session.get(TAB_STATE_SESSION_KEY, {})
        if state.get(label) != query:
            state[label] = query
            request.session[TAB_STATE_SESSION_KEY] = state

    # --- deleting one object from its detail page

    def get_deleted_objects(self, objs, request):
        """What the confirmation page lists: the rows themselves and a summary of what goes with them."""
        objs = list(objs)
        summary = self.delete_summary([o.pk for o in objs])
        listed = [confirmation_label(o) for o in objs[:20]] + (
            [f"… and {len(objs) - 20} more"] if len(objs) > 20 else []
        )
        counts = {self.model._meta.verbose_name_plural: len(objs)}
        counts.update(dict(summary))
        return listed, counts, set(), []

    def delete_model(self, request, obj):
        self.delete_memories([obj.pk], actor=admin_actor(request))

    def delete_queryset(self, request, queryset):
        self.delete_memories(list(queryset.values_list("pk", flat=True)), actor=admin_actor(request))


def badge(kind, value, label=None):
    return format_html('<span class="badge badge-{} badge-{}-{}">{}</span>', kind, kind, value, label or value)


def truncate(text, length=60):
    text = str(text)
    return text if len(text) <= length else text[: length - 3] + "..."


def percent(value):
    return f"{round(value * 100)}%"


def duration(ms):
    if ms is None:
        return "–"
    if ms < 1000:
        return f"{ms} ms"
    return f"{ms / 1000:.1f} s"


class SafeJSONField(forms.JSONField):
    """Django's JSON form field, but a value that cannot be encoded (a lone surrogate a hostile form
    sent) is shown escaped when the form comes back with its error, instead of failing the page."""

    def prepare_value(self, value):
        text = super().prepare_value(value)
        if isinstance(text, str) and validation.text_problem(text):
            return json.dumps(json.loads(text) if not isinstance(value, forms.fields.InvalidJSONInput) else str(value))
        return text


class FactForm(forms.ModelForm):
    """Value, confidence and type: checked as the service checks them, each error on its field."""

    value = SafeJSONField()

    class Meta:
        model = Fact
        fields = ["value", "fact_type", "confidence"]

    def clean(self):
        cleaned = super().clean()
        for name, check in (("value", validation.check_json), ("confidence", None)):
            if name not in cleaned:
                continue
            try:
                if check is not None:
                    check(name, cleaned[name])
                elif not 0.0 <= float(cleaned[name]) <= 1.0:
                    raise InvalidMemoryArgument(name, "must be from 0 to 1")
            except InvalidMemoryArgument as exc:
                self.add_error(name, exc.message)
        return cleaned
