"""Async counterparts of the service calls LangGraph code makes (`await memory.arecall(...)`).

Each runs its sync method through `off_the_loop`: on a worker thread of the running event loop's
pool, so the loop never waits for a query or the embedding model, and concurrent calls (the graphs
of a LangGraph server, several MCP clients, ASGI requests) run side by side. asgiref's
thread-sensitive mode would put every call of a program outside a Django request on one thread, one
at a time: one call waiting for a lock or the model would hold up all the others.
"""

import functools

from asgiref.sync import sync_to_async
from django.db import close_old_connections


def _with_connection_care(func, *args, **kwargs):
    close_old_connections()
    try:
        return func(*args, **kwargs)
    finally:
        close_old_connections()


def off_the_loop(func):
    """`func` as an async function run on a worker thread of the event loop's pool.

    With the connection care Django gives a request's own thread: a broken connection, or one older
    than CONN_MAX_AGE, is replaced before the call and closed after it. Django's connections belong to
    the thread that opened them, so each pool thread keeps one (at most the pool's size, and no
    transaction spans two calls: each service call commits its own).
    """
    return sync_to_async(functools.partial(_with_connection_care, func), thread_sensitive=False)


def awaitable(name):
    """`a<name>` for MemoryService: its method `name`, run off the event loop (same arguments, same result)."""

    async def call(self, *args, **kwargs):
        return await off_the_loop(getattr(self, name))(*args, **kwargs)

    call.__name__ = call.__qualname__ = f"a{name}"
    call.__doc__ = f"`{name}` without blocking the event loop (same arguments, same result)."
    return call
