"""The /memories/ admin site: staff browse and delete what agents remember."""
from django.contrib import admin

from .models import ChannelIdentity, Episode, Fact, MemoryUser, Procedure


class MemoriesAdminSite(admin.AdminSite):
    site_header = "Engram memories"
    site_title = "Engram"
    index_title = "What agents remember"


memories_site = MemoriesAdminSite(name="memories")


@admin.register(Fact, site=memories_site)
class FactAdmin(admin.ModelAdmin):
    list_display = ["key", "short_value", "scope", "fact_type", "confidence", "access_count", "last_accessed", "updated_at"]
    list_filter = ["scope", "fact_type"]
    search_fields = ["key", "search_text", "agent_id", "session_id"]
    list_select_related = ["user"]
    readonly_fields = ["scope_key", "search_text", "created_at", "updated_at"]
    raw_id_fields = ["user", "source_episode"]
    list_per_page = 50

    @admin.display(description="value")
    def short_value(self, obj):
        text = str(obj.value)
        return text if len(text) <= 60 else text[:57] + "..."


@admin.register(Episode, site=memories_site)
class EpisodeAdmin(admin.ModelAdmin):
    list_display = ["id", "agent_id", "trigger_type", "success", "summary", "started_at", "duration_ms"]
    list_filter = ["success", "trigger_type", "processed_for_facts"]
    search_fields = ["agent_id", "summary", "workflow"]
    raw_id_fields = ["user"]
    list_per_page = 50


@admin.register(Procedure, site=memories_site)
class ProcedureAdmin(admin.ModelAdmin):
    list_display = ["name", "agent_id", "procedure_type", "times_used", "success_rate", "is_active"]
    list_filter = ["procedure_type", "is_active", "source"]
    search_fields = ["name", "description", "agent_id"]
    raw_id_fields = ["parent"]
    list_per_page = 50


class ChannelIdentityInline(admin.TabularInline):
    model = ChannelIdentity
    extra = 0


@admin.register(MemoryUser, site=memories_site)
class MemoryUserAdmin(admin.ModelAdmin):
    list_display = ["display_name", "canonical_id", "total_conversations", "last_seen", "merged_into"]
    search_fields = ["display_name", "canonical_id", "identities__external_id"]
    raw_id_fields = ["merged_into"]
    inlines = [ChannelIdentityInline]
    list_per_page = 50
