"""The Teams tab of the /memories/ admin: named groups of agents that share facts (scope "team").

Staff add teams and edit their names and members here (a team is configuration, not something an
agent remembers); deleting one goes through MemoryService.delete_teams, its facts with it.
"""

from django.contrib import admin
from django.db.models import Count
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from ..models import Fact, Team, TeamMember
from ..service import MemoryService
from .site import MemoriesTab, memories_site


class TeamMemberInline(admin.TabularInline):
    model = TeamMember
    fields = ["agent_id"]
    extra = 1

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff

    has_change_permission = has_add_permission = has_delete_permission = has_view_permission


@admin.register(Team, site=memories_site)
class TeamAdmin(MemoriesTab, admin.ModelAdmin):
    tab_label, tab_position = "Teams", 55
    list_display = ["name", "members", "team_facts", "created_at"]
    search_fields = ["name", "members__agent_id"]
    fields = ["name", "description"]
    inlines = [TeamMemberInline]

    def has_add_permission(self, request):
        return request.user.is_active and request.user.is_staff

    def get_queryset(self, request):
        return MemoryService().team_list().annotate(fact_count=Count("facts", distinct=True))

    def delete_memories(self, ids, actor=""):
        return MemoryService().delete_teams(ids, actor=actor)

    def delete_summary(self, ids):
        return [("team facts", Fact.objects.filter(team__in=ids).count())]

    @admin.display(description="members")
    def members(self, obj):
        return ", ".join(sorted(m.agent_id for m in obj.members.all())) or "–"

    @admin.display(description="facts", ordering="fact_count")
    def team_facts(self, obj):
        url = reverse(f"{self.admin_site.name}:memory_fact_changelist") + "?" + urlencode({"team__id__exact": obj.pk})
        return format_html('<a href="{}">{}</a>', url, obj.fact_count)
