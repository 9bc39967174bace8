"""Routes of the operators' API, included under /api/v1/ (a SimpleRouter: other apps add their own)."""

from rest_framework.routers import SimpleRouter

from .views import EpisodeViewSet, FactViewSet, MemoryUserViewSet, ProcedureViewSet, StoreItemViewSet

router = SimpleRouter()
router.register("facts", FactViewSet, basename="fact")
router.register("episodes", EpisodeViewSet, basename="episode")
router.register("procedures", ProcedureViewSet, basename="procedure")
router.register("memory-users", MemoryUserViewSet, basename="memory-user")
router.register("store-items", StoreItemViewSet, basename="store-item")

urlpatterns = router.urls
