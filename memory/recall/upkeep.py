"""Request-bound upkeep of recall: buffered statistics written after each request, the embedding worker
started with the first. Connected in MemoryConfig.ready (memory/apps.py)."""

import logging

from django.db import DatabaseError

from ..buffers import flush_all
from . import access, events, relations  # noqa: F401  (their buffers join BUFFERS)
from .indexer import indexer

logger = logging.getLogger("engram.memory")


def flush_buffers(**kwargs):
    """Write what the request noted (reads' counts and events, writes' `contradicts` edges), in one
    write transaction."""
    try:
        flush_all()
    except DatabaseError:  # statistics and hints, not memory: say so and let the response go out
        logger.exception("could not write buffered access counts, recall events and contradiction edges")


def start_indexer(**kwargs):
    """A serving process starts its embedding worker with its first request: it embeds what is pending."""
    indexer.start()
