"""URL routes of the Engram site."""

from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from memory.admin import memories_site
from memory.healthz import healthz
from memory.recall_views import RecallView

urlpatterns = [
    path("", RedirectView.as_view(url="/memories/", permanent=False)),
    path("memories/", memories_site.urls),
    path("api/v1/recall/", RecallView.as_view(), name="recall"),
    path("api/v1/", include("memory.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("", include("workflows.urls")),
    path("healthz", healthz, name="healthz"),
]

# JSON error answers under /api/ and /telegram/ (memory/api/errors.py); Django's pages elsewhere.
handler400 = "memory.api.errors.bad_request"
handler404 = "memory.api.errors.not_found"
handler500 = "memory.api.errors.server_error"
