"""Routes of the operators' API, included under /api/v1/ (a SimpleRouter: other apps add their own)."""

from rest_framework.routers import SimpleRouter

from .views import (
    EpisodeViewSet,
    FactVersionViewSet,
    FactViewSet,
    MemoryUserViewSet,
    ProcedureViewSet,
    PromotionViewSet,
    RelationViewSet,
    StoreItemViewSet,
    TeamViewSet,
)

router = SimpleRouter()
router.register("facts", FactViewSet, basename="fact")
router.register("episodes", EpisodeViewSet, basename="episode")
router.register("procedures", ProcedureViewSet, basename="procedure")
router.register("memory-users", MemoryUserViewSet, basename="memory-user")
router.register("store-items", StoreItemViewSet, basename="store-item")
router.register("fact-versions", FactVersionViewSet, basename="fact-version")
router.register("promotions", PromotionViewSet, basename="promotion")
router.register("relations", RelationViewSet, basename="relation")
router.register("teams", TeamViewSet, basename="team")

urlpatterns = router.urls
