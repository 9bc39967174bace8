"""URL routes of the Engram site."""
from django.urls import path
from django.views.generic import RedirectView

from memory.admin import memories_site
from memory.healthz import healthz

urlpatterns = [
    path("", RedirectView.as_view(url="/memories/", permanent=False)),
    path("memories/", memories_site.urls),
    path("healthz", healthz, name="healthz"),
]
