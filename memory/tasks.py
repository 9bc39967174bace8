"""Memory's background work as Celery tasks, around the functions the embedded default runs in-process.

The site's Celery app (platform/config/celery.py) finds this module with `autodiscover_tasks()`; a
host project's own app does the same. With no broker configured (MEMORY["TASK_BROKER"] blank)
nothing here runs: each process embeds on its own worker thread and the `memory` commands do the rest.

- `memory.embed_pending`: embed what is pending, by claim (memory/recall/claims.py). Writers queue it
  after each commit; any worker may take it, and a duplicate finds nothing left to claim.
- `memory.link_similar`: the `similar` edges of documents just embedded (memory/recall/relations.py).
- `vector_cache` (a remote-control command, `celery inspect vector_cache`): the worker's vector cache.
- `memory.consolidate`, `memory.promote`, `memory.prune`: the beat's periodic jobs, each run once per
  period across every beat and machine (`once_per_period`). `workflows.deliver_reminders` joins them
  from the workflows app (memory never imports workflows).

A worker serves no requests, so the bundled model runs in the worker's own process (one copy of it,
not one more per child process: memory.embedding.embedder.serve_tasks_only), and after a batch the
memory its activations took goes back to the system.
"""

import logging
import time

from celery import shared_task
from celery.signals import worker_init
from celery.worker.control import inspect_command

from .service import MemoryService

logger = logging.getLogger("engram.memory")

# One embed_pending task drains for at most this long; what is left goes to the next one (the
# writers' next task, or the beat's sweep), so a backlog never holds a worker for good.
DRAIN_SECONDS = 60.0


@worker_init.connect
def _serve_tasks_only(**kwargs):
    from .embedding.embedder import serve_tasks_only

    serve_tasks_only()


@inspect_command()
def vector_cache(state):
    """This worker's vector cache figures, as /healthz gives a server's (bytes held, cap, owners, hits,
    loads, evictions): `celery -A config inspect vector_cache`. A worker serves no HTTP, and its cache
    (the owners its `similar` links touched) is the part of its memory that grows with the store."""
    from .recall.vectors import cache_stats

    return cache_stats()


@shared_task(name="memory.embed_pending", ignore_result=True)
def embed_pending():
    """Embed every pending document this worker can claim; then queue the `similar` edges of those."""
    from .embedding.embedder import configured_mode
    from .embedding.model_process import release_freed_memory
    from .recall.indexer import drain_pending, model_texts

    if configured_mode() != "hybrid":
        return {"stored": 0}
    before = model_texts["count"]
    stored, embedded = drain_pending(deadline=time.monotonic() + DRAIN_SECONDS)
    if embedded:
        link_similar.delay(embedded)
    texts = model_texts["count"] - before
    if texts:
        # The model's activations for a batch are freed, but glibc keeps the pages: without this a
        # worker stays at the size of the longest batch it ever embedded.
        release_freed_memory()
    report = {"stored": stored, "model_texts": texts}
    if stored:
        logger.info("embedded %(stored)d documents (%(model_texts)d texts to the model)", report)
    return report


@shared_task(name="memory.link_similar", ignore_result=True)
def link_similar(ids):
    from .embedding.embedder import get_embedder
    from .recall.relations import link_similar_ids

    embedder = get_embedder()
    if embedder is not None and ids:
        link_similar_ids(sorted(ids), embedder.dimension)


@shared_task(name="memory.periodic_embed_pending", ignore_result=True)
def periodic_embed_pending(period):
    """The beat's sweep: documents whose writer queued no task (a broker that was down, a process
    without the broker setting) or whose claim lapsed."""
    if MemoryService().once_per_period("embed_pending", period):
        return embed_pending()
    return None


@shared_task(name="memory.consolidate", ignore_result=True)
def consolidate(period):
    if MemoryService().once_per_period("consolidate", period):
        report = MemoryService().consolidate()
        return {"ok": report.ok}
    return None


@shared_task(name="memory.promote", ignore_result=True)
def promote(period):
    if MemoryService().once_per_period("promote", period):
        MemoryService().promote()
        return {"ok": True}
    return None


@shared_task(name="memory.prune", ignore_result=True)
def prune(period):
    """MEMORY["LIMITS"] and every app's own pruning (`memory prune`): TTLs, retention, thread limits."""
    if MemoryService().once_per_period("prune", period):
        MemoryService().prune()
        return {"ok": True}
    return None
