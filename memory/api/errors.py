"""The site's error pages: JSON for the API and the webhook (what their clients parse), HTML elsewhere.

Django answers some requests before any view runs: a path no route matches (a workflow slug with a
period), a body over DATA_UPLOAD_MAX_MEMORY_SIZE, an unhandled exception. Its default pages are
HTML; API clients get the same JSON shape as every other API error instead, and a body that is too
large is a 413 naming the body, as the README promises.
"""

from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse
from django.views import defaults

JSON_PREFIXES = ("/api/", "/telegram/")


def _wants_json(request):
    return request.path.startswith(JSON_PREFIXES)


def bad_request(request, exception=None):
    if isinstance(exception, RequestDataTooBig) and _wants_json(request):
        return JsonResponse(
            {"detail": "Request body too large.", "body": ["exceeds the largest body accepted"]}, status=413
        )
    if _wants_json(request):
        return JsonResponse({"detail": "Bad request."}, status=400)
    return defaults.bad_request(request, exception)


def not_found(request, exception=None):
    if _wants_json(request):
        return JsonResponse({"detail": "Not found.", "path": ["no such resource"]}, status=404)
    return defaults.page_not_found(request, exception)


def server_error(request):
    if _wants_json(request):
        return JsonResponse({"detail": "Server error: it was logged with its traceback."}, status=500)
    return defaults.server_error(request)
