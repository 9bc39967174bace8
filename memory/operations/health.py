"""Memory health (five metrics, a score and its colour band) and the component checks /healthz reports.

Internal to the memory service: call `MemoryService.memory_health()` (the `memory health` command).

Each metric is 0..100, read from the memory tables:

| metric       | weight | question                                                                |
|--------------|--------|-------------------------------------------------------------------------|
| freshness    | 25%    | how recent is what is known? 100 * 0.5 ** (median fact age / half-life)  |
| coverage     | 25%    | what share of finished episodes has been consolidated into facts?        |
| coherence    | 20%    | how consistent are the facts? mean of 1 - contradicted / (confirmed + contradicted + 1) |
| efficiency   | 15%    | what share of facts old enough to have been recalled has been recalled?  |
| reachability | 15%    | what share of facts the memory graph reaches: with an edge (memory/recall/relations.py) or a source episode? |

A metric with nothing to measure (no facts, no finished episodes) is None and left out; the score is
the weighted mean of the others. Bands: red < 50, yellow 50-75, green >= 75; "unknown" when
nothing can be measured (an empty memory).

Components: /healthz reports the database (checked here), and whatever other apps register with
`register_component(name, check)` (the checkpointer: "unknown" until workflows register it); the
recall mode is recall's own: "hybrid" with an embedder configured and installed, else "keyword-only";
the vector cache (`vector_cache`) is this process's own, like the embedding worker's failures.
"""

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Avg, Count, F, FloatField, Q
from django.db.models.functions import Cast
from django.utils import timezone

from ..conf import memory_settings
from ..embedding.embedder import configured_mode
from ..models import Episode, Fact, MemoryRelation, RecallDocument, RecallKind
from ..models.workspaces import current_workspace_id
from ..recall.relations import contradictions
from ..recall.vectors import cache_stats

WEIGHTS = {"freshness": 25, "coverage": 25, "coherence": 20, "efficiency": 15, "reachability": 15}
GREEN, YELLOW, RED, UNKNOWN = "green", "yellow", "red", "unknown"


@dataclass
class HealthReport:
    metrics: dict
    score: float | None
    band: str
    agent_id: str | None = None
    computed_at: datetime = field(default_factory=timezone.now)

    def as_dict(self):
        return {
            "band": self.band,
            "score": None if self.score is None else round(self.score, 1),
            "metrics": {k: None if v is None else round(v, 1) for k, v in self.metrics.items()},
            "weights": dict(WEIGHTS),
            "agent_id": self.agent_id,
            "computed_at": self.computed_at.isoformat(),
        }


def band_of(score):
    if score is None:
        return UNKNOWN
    if score >= 75:
        return GREEN
    if score >= 50:
        return YELLOW
    return RED


def _share(part, whole):
    return None if not whole else 100.0 * part / whole


def _facts_with_edges():
    """Ids of facts with at least one edge of the memory graph, either way (reachability)."""
    linked = RecallDocument.objects.filter(kind=RecallKind.FACT).filter(
        Q(pk__in=MemoryRelation.objects.values("source_id"))
        | Q(pk__in=MemoryRelation.objects.filter(target__isnull=False).values("target_id"))
    )
    return linked.values("item_id")


def compute(agent_id=None):
    """The five metrics, score and band; of one agent's memory (its own facts, facts from its episodes, its episodes) or all."""
    contradictions.flush()  # edges this process's writes have not written yet count too
    conf = memory_settings.HEALTH
    now = timezone.now()
    facts = Fact.objects.all()
    episodes = Episode.objects.filter(ended_at__isnull=False)
    if agent_id is not None:
        facts = facts.filter(Q(agent_id=agent_id) | Q(source_episode__agent_id=agent_id))
        episodes = episodes.filter(agent_id=agent_id)
    old = now - timedelta(days=conf["EFFICIENCY_MIN_AGE_DAYS"])
    confirmed = Cast(F("times_confirmed"), FloatField())
    contradicted = Cast(F("times_contradicted"), FloatField())
    stats = facts.aggregate(
        n=Count("id"),
        coherence=Avg(1.0 - contradicted / (confirmed + contradicted + 1.0)),
        old=Count("id", filter=Q(created_at__lte=old)),
        old_used=Count("id", filter=Q(created_at__lte=old, access_count__gt=0)),
        traced=Count("id", filter=Q(source_episode__isnull=False) | Q(pk__in=_facts_with_edges())),
    )
    episode_stats = episodes.aggregate(n=Count("id"), done=Count("id", filter=Q(processed_for_facts=True)))
    freshness = None
    if stats["n"]:
        median = facts.order_by("updated_at").values_list("updated_at", flat=True)[stats["n"] // 2]
        age_days = max(0.0, (now - median).total_seconds() / 86400)
        freshness = 100.0 * 0.5 ** (age_days / conf["FRESHNESS_HALF_LIFE_DAYS"])
    metrics = {
        "freshness": freshness,
        "coverage": _share(episode_stats["done"], episode_stats["n"]),
        "coherence": None if stats["coherence"] is None else 100.0 * stats["coherence"],
        "efficiency": _share(stats["old_used"], stats["old"]),
        "reachability": _share(stats["traced"], stats["n"]),
    }
    measured = {k: v for k, v in metrics.items() if v is not None}
    score = None
    if measured:
        score = sum(v * WEIGHTS[k] for k, v in measured.items()) / sum(WEIGHTS[k] for k in measured)
    return HealthReport(metrics=metrics, score=score, band=band_of(score), agent_id=agent_id, computed_at=now)


_cache_lock = threading.Lock()
_cache = {}


def cached(agent_id=None):
    """compute(), reused for HEALTH["CACHE_SECONDS"] (a /healthz poller must not scan the store
    each time); one report per workspace (compute counts the current one's rows) and agent."""
    ttl = memory_settings.HEALTH["CACHE_SECONDS"]
    now = time.monotonic()
    key = (current_workspace_id(), agent_id)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and now - hit[0] < ttl:
            return hit[1]
    report = compute(agent_id)
    with _cache_lock:
        _cache[key] = (now, report)
    return report


def clear_cache():
    with _cache_lock:
        _cache.clear()


# ---------------------------------------------------------------- components for /healthz


_components = {"checkpointer": lambda: "unknown"}


def register_component(name, check):
    """Report `check()` (a short status string: "ok", "unreachable", ...) on /healthz under `name`."""
    _components[name] = check


def components():
    return dict(_components)


def recall_mode():
    """How recall searches: "hybrid" (keywords and vectors) or "keyword-only". Loads no model."""
    return configured_mode()


def vector_cache():
    """This process's vector index against its cap (MEMORY["VECTOR_CACHE_MB"]): bytes held, cap_bytes,
    owners held, hits and misses (a sync asking for an owner held or not), loads (statements' worth of
    an owner read), evictions (owners dropped, least recently used, to stay under the cap)."""
    return cache_stats()


def database_status():
    """ "ok" when the default database answers a query, else "unreachable"."""
    from django.db import DatabaseError

    try:
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError:
        return "unreachable"
    return "ok"
