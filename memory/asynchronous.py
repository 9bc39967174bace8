"""Async counterparts of the service calls LangGraph code makes (`await memory.arecall(...)`). Part of MemoryService.

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


def _off_the_loop(name):
    async def call(self, *args, **kwargs):
        return await off_the_loop(getattr(self, name))(*args, **kwargs)

    call.__name__ = f"a{name}"
    call.__qualname__ = f"AsyncMixin.a{name}"
    call.__doc__ = f"`{name}` without blocking the event loop (same arguments, same result)."
    return call


class AsyncMixin:
    """`a<name>` for the calls nodes, tools and the LangGraph store make; part of MemoryService."""

    aget_fact = _off_the_loop("get_fact")
    aset_fact = _off_the_loop("set_fact")
    asearch_facts = _off_the_loop("search_facts")
    alist_facts = _off_the_loop("list_facts")
    adelete_facts = _off_the_loop("delete_facts")
    arecall = _off_the_loop("recall")
    aidentify = _off_the_loop("identify")
    aget_or_create_user = _off_the_loop("get_or_create_user")
    aresolve_user = _off_the_loop("resolve_user")
    arecord_episode = _off_the_loop("record_episode")
    auser_context = _off_the_loop("user_context")
    astore_get_many = _off_the_loop("store_get_many")
    astore_put_many = _off_the_loop("store_put_many")
    astore_search = _off_the_loop("store_search")
    astore_namespaces = _off_the_loop("store_namespaces")
