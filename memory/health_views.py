"""GET /healthz: whether the site is up and how recall runs ({"recall": "hybrid" | "keyword-only"})."""
from django.http import JsonResponse
from django.views.decorators.http import require_GET

from .service import MemoryService


@require_GET
def healthz(request):
    """Public and cheap: loads no model and runs no query."""
    return JsonResponse({"recall": MemoryService().recall_mode()})
