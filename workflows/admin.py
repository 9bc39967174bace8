"""Workflows on the /memories/ admin site (definitions are validated against the node registry on save)."""
from django.contrib import admin

from memory.admin import memories_site

from .models import Workflow


@admin.register(Workflow, site=memories_site)
class WorkflowAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "is_active", "updated_at"]
    search_fields = ["slug", "name"]

