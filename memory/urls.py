"""URL routes of the memory app, for a project's urls.py: `path("", include("memory.urls"))`.

/memories/ (the operators' admin), /api/v1/ (the REST API and recall), /api/schema/ and /api/docs/
(its OpenAPI schema and Swagger UI, staff only), /healthz and /metrics (Prometheus).
"""

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from .admin.tabs import memories_site
from .api.healthz import healthz, prometheus_metrics
from .api.policy import StaffAPI
from .api.recall_views import RecallView

# The schema and its docs page: staff only, as the API they describe.
_STAFF = {"authentication_classes": StaffAPI.authentication_classes, "permission_classes": StaffAPI.permission_classes}

urlpatterns = [
    path("memories/", memories_site.urls),
    path("api/v1/recall/", RecallView.as_view(), name="recall"),
    path("api/v1/", include("memory.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(**_STAFF), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema", **_STAFF), name="api-docs"),
    path("healthz", healthz, name="healthz"),
    path("metrics", prometheus_metrics, name="metrics"),
]
