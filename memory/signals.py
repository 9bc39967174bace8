"""Signals of the memory app, and the receivers that keep buffered state written."""

import logging

from django.core.signals import request_finished, request_started
from django.db import DatabaseError
from django.dispatch import Signal, receiver

logger = logging.getLogger("engram.memory")

# Sent inside the merge transaction with `source_id` and `target_id`, so apps that keep their own
# per-user rows (conversation threads) can move them to the surviving user.
users_merged = Signal()

# Sent inside the delete transaction, before memory users are deleted with `cascade=True`, with
# `user_ids` (the users asked for and every user merged into them). Apps that keep per-user data
# outside the memory tables (conversation threads and their checkpoints) delete it here; a receiver
# that raises aborts the delete, and nothing is deleted.
users_deleting = Signal()

# Sent by MemoryService.user_footprint with `user_ids`: receivers return {what: count} of what they
# keep for those users (workflows: threads, checkpoints), so a deletion's confirmation and answer
# count everything that goes.
users_footprint = Signal()

# Sent by MemoryService.export_person with `user_ids` (the person and users merged into them):
# receivers return a list of JSON-ready dicts (each with a "kind") of what they keep for them.
person_exporting = Signal()


# Sent by MemoryService.prune() (the `memory prune` command) with `agent_id` (None: every agent) and
# `dry_run`, after the memory tables are pruned, so apps that keep their own growing rows
# (conversation threads and checkpoints, recall events) prune them with the same command.
# A receiver returns {what: rows deleted (or that would be, on a dry run)}; the counts join the report.
prune_requested = Signal()

# ---- buffered statistics (access counts, recall events and reference counts) and graph edges.
from .buffers import flush_all  # noqa: E402
from .domain import access  # noqa: E402, F401  (their buffers join BUFFERS)
from .recall import events, relations  # noqa: E402, F401
from .recall.indexer import indexer  # noqa: E402


@receiver(request_finished, dispatch_uid="memory_flush_buffers")
def flush_buffers(**kwargs):
    """Write what the request noted (reads' counts and events, writes' `contradicts` edges), in one
    write transaction."""
    try:
        flush_all()
    except DatabaseError:  # statistics and hints, not memory: say so and let the response go out
        logger.exception("could not write buffered access counts, recall events and contradiction edges")


@receiver(request_started, dispatch_uid="memory_start_indexer")
def start_indexer(**kwargs):
    """A serving process starts its embedding worker with its first request: it embeds what is pending."""
    indexer.start()
