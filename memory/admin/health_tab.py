"""The Health tab of /memories/: daily health snapshots (`memory health --snapshot`), a chart of each agent's score over
the last CHART_DAYS days above the list."""

from django.contrib import admin
from django.utils.html import format_html, format_html_join

from ..models import HealthSnapshot
from ..service import MemoryService
from .site import MemoriesTab, badge, memories_site

CHART_DAYS = 30
WIDTH, HEIGHT = 300, 60
BAND_COLOURS = {"green": "#2e7d32", "yellow": "#f9a825", "red": "#c62828", "unknown": "#9e9e9e"}


def score_chart(snapshots):
    """An inline SVG line of the scores (0-100, one point per day, days without a score skipped), with
    the bands' borders (50, 75) as faint lines. Built from numbers only."""
    scored = [(s.day, s.score) for s in snapshots if s.score is not None]
    if not scored:
        return format_html("<em>{}</em>", "no score yet")
    first = scored[0][0]
    span = max((scored[-1][0] - first).days, 1)
    points = " ".join(
        f"{(day - first).days / span * WIDTH:.1f},{HEIGHT - score / 100 * HEIGHT:.1f}" for day, score in scored
    )
    borders = format_html_join(
        "",
        '<line x1="0" x2="{}" y1="{}" y2="{}" stroke="#ddd" stroke-width="1"/>',
        ((WIDTH, f"{HEIGHT - b / 100 * HEIGHT:.1f}", f"{HEIGHT - b / 100 * HEIGHT:.1f}") for b in (50, 75)),
    )
    colour = BAND_COLOURS.get(snapshots[-1].band, BAND_COLOURS["unknown"])
    last_x, last_y = points.split()[-1].split(",")  # the latest day, a dot (one day alone draws no line)
    return format_html(
        '<svg class="health-chart" width="{}" height="{}" viewBox="0 0 {} {}" role="img" aria-label="{}">'
        '{}<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>'
        '<circle cx="{}" cy="{}" r="3" fill="{}"/></svg>',
        WIDTH,
        HEIGHT,
        WIDTH,
        HEIGHT,
        f"health score from {first} to {scored[-1][0]}",
        borders,
        colour,
        points,
        last_x,
        last_y,
        colour,
    )


@admin.register(HealthSnapshot, site=memories_site)
class HealthSnapshotAdmin(MemoriesTab, admin.ModelAdmin):
    """Daily health of the whole memory and of each agent: read only; old days go by HEALTH["SNAPSHOT_DAYS"]."""

    tab_label, tab_position = "Health", 95
    change_list_template = "admin/memories/health_change_list.html"
    list_display = ["day", "agent", "band_badge", "score_shown"]
    list_filter = ["band"]
    search_fields = ["agent_id"]
    fields = ["day", "agent_id", "band", "score", "metrics", "taken_at"]
    readonly_fields = fields
    ordering = ["-day", "agent_id"]
    actions = []

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # kept for SNAPSHOT_DAYS, then deleted by the next snapshot

    def delete_memories(self, ids, actor=""):
        raise PermissionError("health snapshots are not deleted by hand")

    def delete_summary(self, ids):
        return []

    def changelist_view(self, request, extra_context=None):
        service = MemoryService()
        agents = sorted(set(HealthSnapshot.objects.values_list("agent_id", flat=True)))
        charts = [
            (agent or "all agents", score_chart(service.health_snapshots(agent_id=agent, days=CHART_DAYS)))
            for agent in agents
        ]
        return super().changelist_view(request, {**(extra_context or {}), "health_charts": charts})

    @admin.display(description="agent", ordering="agent_id")
    def agent(self, obj):
        return obj.agent_id or "(all agents)"

    @admin.display(description="band", ordering="band")
    def band_badge(self, obj):
        return badge("band", obj.band)

    @admin.display(description="score", ordering="score")
    def score_shown(self, obj):
        return "n/a" if obj.score is None else f"{obj.score:.1f}"
