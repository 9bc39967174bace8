"""GET /healthz: whether the site can serve memory, for load balancers and operators (no login, no memory content);
GET /metrics: the same kind of figures in Prometheus's text format (memory/operations/metrics.py).

Anonymous (and the metrics scraper's bearer token): the figures of the whole deployment. With a
staff account's API token or admin session: the memory figures (health band and score, counts,
vector backlog) of that account's workspace only, as its API sees; what belongs to the process or
the site (database, recall mode, vector cache, errors, consolidation runs, recall latency) stays
the deployment's.
"""

import logging
import threading

from django.core.signals import got_request_exception
from django.db import DatabaseError
from django.http import HttpResponse, JsonResponse
from django.utils.crypto import constant_time_compare
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from rest_framework.exceptions import AuthenticationFailed

from ..conf import memory_settings
from ..operations import health, metrics
from ..recall.indexer import indexer
from ..service import MemoryService
from .workspaces import enter_workspace_of_staff

logger = logging.getLogger("engram.memory")


class _ErrorCount:
    """Unhandled exceptions of requests served by this process since it started (shown on /healthz)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.count = 0

    def __call__(self, sender, request=None, **kwargs):
        with self.lock:
            self.count += 1


unhandled_errors = _ErrorCount()
got_request_exception.connect(unhandled_errors, dispatch_uid="memory_healthz_count_errors")


@never_cache
@require_GET
def healthz(request):
    """Database, checkpointer (and other registered components), recall mode, last consolidation, health band.

    200 with "status": "ok" (or "degraded" when a component reports a problem or the band is red);
    503 with "status": "unavailable" when the database does not answer; 401 for an unknown API token.
    A staff account's token or session: its workspace's health band (module docstring).
    """
    try:
        enter_workspace_of_staff(request)
    except AuthenticationFailed as exc:
        return JsonResponse({"status": "unauthorized", "detail": str(exc.detail)}, status=401)
    database = health.database_status()
    body = {"status": "ok", "database": database}
    for name, check in health.components().items():
        try:
            body[name] = check()
        except Exception as exc:  # noqa: BLE001  (a registered check of another app; report, don't crash the probe)
            logger.warning("healthz: %s check failed: %s", name, exc)
            body[name] = "error"
    body["recall"] = health.recall_mode()
    body["unhandled_errors"] = unhandled_errors.count  # this process's, since it started; each is logged
    if database != "ok":
        body.update(status="unavailable", last_consolidation=None, health=None)
        return JsonResponse(body, status=503)
    service = MemoryService()
    try:
        run = service.last_consolidation()
        report = service.memory_health(fresh=False)
    except DatabaseError as exc:  # the database went away between the check and these reads
        logger.warning("healthz: memory unreadable: %s", exc)
        body.update(status="unavailable", database="unreachable", last_consolidation=None, health=None)
        return JsonResponse(body, status=503)
    body["vectors"] = {
        "pending": service.pending_vectors(),  # committed documents the embedding worker has not reached yet
        "failures": indexer.failures,  # failed embedding batches in this process (each is retried)
        "cache": health.vector_cache(),  # this process's vector index: bytes against its cap, hits, loads, evictions
    }
    body["last_consolidation"] = (
        None
        if run is None
        else {
            "finished_at": run.finished_at.isoformat(),
            "ok": run.ok,
            "episodes_processed": run.episodes_processed,
            "episodes_failed": run.episodes_failed,
        }
    )
    body["health"] = {"band": report.band, "score": None if report.score is None else round(report.score, 1)}
    problems = [name for name in health.components() if body[name] not in ("ok", "unknown")]
    if problems or report.band == health.RED:
        body["status"] = "degraded"
    return JsonResponse(body)


@never_cache
@require_GET
def prometheus_metrics(request):
    """Counts, vector backlog, errors and recall latency for Prometheus; no memory content.

    With MEMORY["METRICS_TOKEN"] set, the scraper must send it as `Authorization: Bearer <token>`
    (else 401); blank, the endpoint is open, as /healthz is. A staff account's API token or session
    is let in too, and sees its workspace's counts and backlog (module docstring); an unknown API
    token is a 401. 503 when the database does not answer.
    """
    try:
        staff = enter_workspace_of_staff(request)
    except AuthenticationFailed as exc:
        return HttpResponse(f"metrics: {exc.detail}\n", status=401, content_type="text/plain")
    token = memory_settings.METRICS_TOKEN
    if (
        staff is None
        and token
        and not constant_time_compare(request.headers.get("Authorization", ""), f"Bearer {token}")
    ):
        return HttpResponse("metrics: a bearer token is required\n", status=401, content_type="text/plain")
    service = MemoryService()
    try:
        counts = service.memory_counts()
        backlog = service.pending_vectors()
        text = metrics.render(
            counts=counts,
            backlog=backlog,
            errors={"unhandled_request": unhandled_errors.count, "embedding_batch": indexer.failures},
        )
    except DatabaseError as exc:
        logger.warning("metrics: memory unreadable: %s", exc)
        return HttpResponse("metrics: the database does not answer\n", status=503, content_type="text/plain")
    return HttpResponse(text, content_type=metrics.CONTENT_TYPE)
