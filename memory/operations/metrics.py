"""Metrics in Prometheus's text format for GET /metrics, with the official client (prometheus_client).

Two kinds. Measured as they happen, in this process: recall latency (a histogram of MemoryService.recall).
Read when scraped: memory counts (rows per kind, facts per scope), the vector backlog, errors (this
process's unhandled request errors and failed embedding batches), and what other apps register with
`register_gauge(name, help, read)` (workflows: reminders due). A scrape reads the database (one
query per table, as `memory stats` does), so scrape every 15 seconds or more, not in a tight loop.

Measured metrics are per process: with several server processes, each answers with its own
histogram (Prometheus sums them across the targets it scrapes; prometheus_client's multiprocess
mode is not used, since it needs a shared directory set before the server starts).
"""

import functools
import threading
import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = CONTENT_TYPE_LATEST
REGISTRY = CollectorRegistry(auto_describe=False)
RECALL_SECONDS = Histogram(
    "engram_recall_duration_seconds",
    "How long MemoryService.recall took (this process, since it started).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)

_gauges = {}
_lock = threading.Lock()


def timed_recall(recall):
    """`recall` (MemoryService.recall), its every call observed in RECALL_SECONDS (a failed one too)."""

    @functools.wraps(recall)
    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return recall(*args, **kwargs)
        finally:
            RECALL_SECONDS.observe(time.perf_counter() - started)

    return timed


def register_gauge(name, documentation, read):
    """Another app's gauge, read at each scrape: `read()` returns a number. `name` gets the prefix `engram_`."""
    with _lock:
        _gauges[f"engram_{name}"] = (documentation, read)


class _Scrape:
    """The metrics read at scrape time, from `values` (what the view read through MemoryService)."""

    def __init__(self, values):
        self.values = values

    def collect(self):
        v = self.values
        rows = GaugeMetricFamily("engram_memory_rows", "Rows of memory per kind.", labels=["kind"])
        for kind in ("facts", "episodes", "procedures", "users", "identities"):
            rows.add_metric([kind], v["counts"][kind])
        yield rows
        by_scope = GaugeMetricFamily("engram_facts", "Facts per scope.", labels=["scope"])
        for scope, n in v["counts"]["facts_by_scope"].items():
            by_scope.add_metric([scope], n)
        yield by_scope
        yield GaugeMetricFamily(
            "engram_episodes_unconsolidated",
            "Finished episodes consolidation has not read yet.",
            value=v["counts"]["episodes_unconsolidated"],
        )
        yield GaugeMetricFamily(
            "engram_procedures_active", "Active procedures.", value=v["counts"]["procedures_active"]
        )
        yield GaugeMetricFamily(
            "engram_vector_backlog", "Recall documents and store items waiting for a vector.", value=v["backlog"]
        )
        errors = CounterMetricFamily(
            "engram_errors", "Errors of this process since it started, by kind.", labels=["kind"]
        )
        for kind, n in v["errors"].items():
            errors.add_metric([kind], n)
        yield errors
        with _lock:
            gauges = dict(_gauges)
        for name, (documentation, read) in sorted(gauges.items()):
            yield GaugeMetricFamily(name, documentation, value=read())


def render(*, counts, backlog, errors):
    """The text of GET /metrics: the measured metrics, then those read now."""
    scrape = CollectorRegistry(auto_describe=False)
    scrape.register(_Scrape({"counts": counts, "backlog": backlog, "errors": errors}))
    return generate_latest(REGISTRY) + generate_latest(scrape)
