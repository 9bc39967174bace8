"""URL routes of the Engram site."""
from django.urls import include, path
from django.views.generic import RedirectView

from memory.admin import memories_site

urlpatterns = [
    path("", RedirectView.as_view(url="/memories/", permanent=False)),
    path("memories/", memories_site.urls),
    path("", include("workflows.urls")),
]
