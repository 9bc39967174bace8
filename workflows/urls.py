"""URL routes of the workflows app: the staff API under api/v1/, the Telegram webhook, the builder at builder/."""

from django.urls import include, path
from rest_framework.routers import DefaultRouter

from .api import CheckpointViewSet, ReminderViewSet
from .builder import views
from .builder.api import RunViewSet, builder_page

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("node-types", views.NodeTypeViewSet, basename="node-type")
router.register("workflows", views.WorkflowViewSet, basename="workflow")
router.register("checkpoints", CheckpointViewSet, basename="checkpoint")
router.register("reminders", ReminderViewSet, basename="reminder")
router.register("runs", RunViewSet, basename="run")

app_name = "workflows"

urlpatterns = [
    path("api/v1/", include(router.urls)),
    path("telegram/<slug:slug>/webhook/", views.telegram_webhook, name="telegram-webhook"),
    path("builder/", builder_page, name="builder"),
    # The builder's own routes (a deep link reloaded) get the same page.
    path("builder/<path:path>", builder_page, name="builder-route"),
]
