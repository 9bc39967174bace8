"""Async counterparts of the service calls LangGraph code makes (`await memory.arecall(...)`). Part of MemoryService.

Each runs its sync method through asgiref's `sync_to_async` (thread-sensitive): Django's database
connections belong to the thread that opened them, so every call of an event loop's program runs on
one worker thread, in order, and the loop itself never waits for a query or the embedding model.
"""

from asgiref.sync import sync_to_async


def _off_the_loop(name):
    async def call(self, *args, **kwargs):
        return await sync_to_async(getattr(self, name), thread_sensitive=True)(*args, **kwargs)

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
