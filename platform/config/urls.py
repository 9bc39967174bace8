"""URL routes of the Engram site."""
from django.urls import path
from django.views.generic import RedirectView

from memory.admin import memories_site
from memory.health_views import healthz
from memory.recall_views import RecallView

urlpatterns = [
    path("", RedirectView.as_view(url="/memories/", permanent=False)),
    path("memories/", memories_site.urls),
    path("api/v1/recall/", RecallView.as_view(), name="recall"),
    path("healthz", healthz, name="healthz"),
]
