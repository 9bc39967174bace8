"""URL routes of the workflows app: the staff API under api/v1/, and the Telegram webhook."""

from django.urls import include, path
from rest_framework.routers import DefaultRouter

from . import views
from .api import CheckpointViewSet, ReminderViewSet

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("node-types", views.NodeTypeViewSet, basename="node-type")
router.register("workflows", views.WorkflowViewSet, basename="workflow")
router.register("checkpoints", CheckpointViewSet, basename="checkpoint")
router.register("reminders", ReminderViewSet, basename="reminder")

app_name = "workflows"

urlpatterns = [
    path("api/v1/", include(router.urls)),
    path("telegram/<slug:slug>/webhook/", views.telegram_webhook, name="telegram-webhook"),
]
