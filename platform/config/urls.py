"""URL routes of the Engram site: the two apps' routes (as a host project includes them) and the home page (staff to the builder, others to the login)."""

from django.urls import include, path

from workflows.builder.api import home

urlpatterns = [
    path("", home, name="home"),
    path("", include("memory.urls")),
    path("", include("workflows.urls")),
]

# JSON error answers under /api/ and /telegram/ (memory/api/errors.py); Django's pages elsewhere.
handler400 = "memory.api.errors.bad_request"
handler404 = "memory.api.errors.not_found"
handler500 = "memory.api.errors.server_error"
