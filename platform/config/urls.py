"""URL routes of the Engram site: the two apps' routes (as a host project includes them) and a home redirect."""

from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(url="/memories/", permanent=False)),
    path("", include("memory.urls")),
    path("", include("workflows.urls")),
]

# JSON error answers under /api/ and /telegram/ (memory/api/errors.py); Django's pages elsewhere.
handler400 = "memory.api.errors.bad_request"
handler404 = "memory.api.errors.not_found"
handler500 = "memory.api.errors.server_error"
