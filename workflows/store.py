"""EngramStore: a LangGraph `BaseStore` on Engram's memory, for any graph or agent (`compile(store=...)`).

    store = EngramStore()                                   # Engram's embedder, if installed
    store = EngramStore(index={"dims": 384, "embed": my_embeddings, "fields": ["text"]})
    store = EngramStore(ttl={"default_ttl": 60, "refresh_on_read": True})

Items live in MemoryService's tables (memory/domain/store_items.py), owned by their namespace
(MemoryService.store_owner): ("users", "<your app's user id>", ...) and langmem's ("memories", "<id>",
...) are that person's (MEMORY["STORE_NAMESPACES"] maps such first labels to an identity channel;
shown on their page in /memories/, exported with them, deleted when they are forgotten), ("engram",
"users", "<memory user id>", ...) names a memory user by Engram's own id, ("agents", "<agent id>",
...) is that agent's, anything else global.

A query search's `score` is what LangGraph's stores give: the cosine similarity of the query's vector
and the item's (its best vector: one per indexed text), None for an item without a vector, and None
throughout without an embedder. With an `index` of its own the results are ordered by that score, as
LangGraph's stores order them; on Engram's embedder the order is hybrid, like recall (the cosine and
the share of the query's words the item holds, so items not embedded yet are found by their words),
while `score` stays the cosine. No embedding model runs inside a database transaction: with an
`index`, values are embedded before their transaction; on Engram's embedder, after it commits.

Expired items (TTLConfig) are invisible at once; `sweep_ttl()` deletes them, and
`start_ttl_sweeper()` / `stop_ttl_sweeper()` run it every `sweep_interval_minutes` on a thread, as
LangGraph's SqliteStore and PostgresStore do (started explicitly, as theirs are).

The sync API also works when called from a coroutine (LangGraph's stores allow it; Django refuses
database work on an event loop's thread): the call then runs on a worker thread while the caller
waits. Async code should prefer the a-methods, which never block the loop.
"""

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from django.db import connection
from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    PutOp,
    SearchItem,
    SearchOp,
    TTLConfig,
)
from langgraph.store.base.embed import ensure_embeddings, get_text_at_path, tokenize_path

from memory.asynchronous import off_the_loop
from memory.domain.store_items import StorePut, joined, split
from memory.embedding.embedder import get_embedder
from memory.exceptions import InvalidMemoryArgument
from memory.service import MemoryService

__all__ = ["EngramStore"]

logger = logging.getLogger(__name__)

_OFF_THE_LOOP = ThreadPoolExecutor(max_workers=4, thread_name_prefix="engram-store")


def _off_the_event_loop(method):
    """Run a sync entry point on a worker thread when it is called on an event loop's thread."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return method(self, *args, **kwargs)
        # In the caller's context: the worker thread works in the caller's workspace.
        context = contextvars.copy_context()
        return _OFF_THE_LOOP.submit(context.run, _closing_connection, method, self, *args, **kwargs).result()

    return wrapper


def _closing_connection(method, *args, **kwargs):
    try:
        return method(*args, **kwargs)
    finally:
        connection.close()  # a pooled thread gives its connection back, as a request does


class EngramStore(BaseStore):
    supports_ttl = True

    def __init__(self, *, index: IndexConfig | None = None, ttl: TTLConfig | None = None) -> None:
        self.index_config = index
        self.ttl_config = ttl
        if index is not None:
            self._embed = self.embeddings = ensure_embeddings(index.get("embed"))
            fields = index.get("fields") or ["$"]
        else:
            self._embed = self.embeddings = None  # Engram's embedder, looked up per batch (settings may change)
            fields = ["$"]
        self._fields = [_path(path) for path in fields]
        self._memory = MemoryService()
        self._ttl_sweeper_thread = None
        self._ttl_stop_event = threading.Event()

    # ---- the BaseStore interface

    @_off_the_event_loop
    def get(self, namespace, key, *, refresh_ttl=None):
        """One item, or None: the read graphs make most, answered without the batch machinery."""
        _check_labels(namespace)
        if refresh_ttl is None:
            refresh_ttl = (self.ttl_config or {}).get("refresh_on_read", True)
        item = self._memory.store_get_one(tuple(namespace), str(key), refresh_ttl=refresh_ttl)
        return None if item is None else _item(Item, item)

    @_off_the_event_loop
    def search(self, namespace_prefix, /, *, query=None, filter=None, limit=10, offset=0, refresh_ttl=None):
        """Items under a namespace prefix (see BaseStore.search), answered without the batch machinery."""
        _check_labels(namespace_prefix)
        if refresh_ttl is None:
            refresh_ttl = (self.ttl_config or {}).get("refresh_on_read", True)
        return self._search(SearchOp(tuple(namespace_prefix), filter, limit, offset, query, refresh_ttl))

    @_off_the_event_loop
    def batch(self, ops):
        ops = list(ops)
        results = [None] * len(ops)
        gets = [(i, op) for i, op in enumerate(ops) if isinstance(op, GetOp)]
        puts = [op for op in ops if isinstance(op, PutOp)]
        if gets:
            found = self._memory.store_get_many(
                [(op.namespace, op.key) for _, op in gets], refresh_ttl=any(op.refresh_ttl for _, op in gets)
            )
            for i, op in gets:
                item = found.get((joined(op.namespace), op.key))
                results[i] = None if item is None else _item(Item, item)
        for i, op in enumerate(ops):
            if isinstance(op, SearchOp):
                results[i] = self._search(op)
            elif isinstance(op, ListNamespacesOp):
                results[i] = self._list_namespaces(op)
            elif not isinstance(op, (GetOp, PutOp)):
                raise ValueError(f"Unknown operation type: {type(op)}")
        if puts:
            self._memory.store_put_many(self._prepared(puts))
        return results

    async def abatch(self, ops):
        """`batch` on a worker thread (memory.asynchronous.off_the_loop): the event loop never waits for
        the database or a model, and other calls go on meanwhile."""
        return await off_the_loop(self.batch)(list(ops))

    def sweep_ttl(self):
        """Delete expired items now; returns how many went (expired items are invisible already)."""
        return self._memory.sweep_store_items()

    def start_ttl_sweeper(self, sweep_interval_minutes=None):
        """Delete expired items every `sweep_interval_minutes` (else the TTL config's, else 5) on a daemon
        thread, as LangGraph's SqliteStore and PostgresStore do; returns a Future that completes when the
        sweeper stops (cancelling it stops it). Without a TTL config nothing starts (a done Future)."""
        if not self.ttl_config:
            future = concurrent.futures.Future()
            future.set_result(None)
            return future
        future = concurrent.futures.Future()
        future.add_done_callback(lambda f: self._ttl_stop_event.set() if f.cancelled() else None)
        if self._ttl_sweeper_thread is not None and self._ttl_sweeper_thread.is_alive():
            logger.info("TTL sweeper thread is already running")
            return future
        self._ttl_stop_event.clear()
        minutes = float(sweep_interval_minutes or self.ttl_config.get("sweep_interval_minutes") or 5)

        def sweep_loop():
            try:
                while not self._ttl_stop_event.wait(minutes * 60):
                    try:
                        swept = self.sweep_ttl()
                    except Exception:  # a failed sweep (the database away) is logged; the next one retries
                        logger.exception("Store TTL sweep failed")
                    else:
                        if swept:
                            logger.info("Store swept %d expired items", swept)
                    finally:
                        connection.close()  # this thread's connection goes back between sweeps
                if not future.done():
                    future.set_result(None)
            except Exception as exc:  # pragma: no cover - only the Event itself could raise here
                if not future.done():
                    future.set_exception(exc)

        self._ttl_sweeper_thread = threading.Thread(target=sweep_loop, daemon=True, name="engram-ttl-sweeper")
        self._ttl_sweeper_thread.start()
        return future

    def stop_ttl_sweeper(self, timeout=None):
        """Stop the sweeper thread, waiting up to `timeout` seconds (None: as long as it takes); True once
        it has stopped or was not running, False when the timeout came first."""
        thread = self._ttl_sweeper_thread
        if thread is None or not thread.is_alive():
            return True
        self._ttl_stop_event.set()
        thread.join(timeout)
        if thread.is_alive():
            logger.warning("Timed out waiting for the TTL sweeper thread to stop")
            return False
        self._ttl_sweeper_thread = None
        return True

    def __del__(self):
        if getattr(self, "_ttl_sweeper_thread", None) is not None:
            self.stop_ttl_sweeper(timeout=0.1)

    # ---- helpers

    def _embedder(self):
        """(embed documents, embed query) functions, or None when nothing can embed."""
        if self._embed is not None:
            return self._embed.embed_documents, self._embed.embed_query
        engram = get_embedder()
        if engram is None:
            return None
        return engram.documents, engram.query

    def _prepared(self, puts):
        """StorePut rows with their search text and, with the store's own `index`, their vectors."""
        rows, texts = [], []
        for op in puts:
            if not op.namespace or any(
                not isinstance(label, str) or not label or "." in label for label in op.namespace
            ):
                raise InvalidNamespaceError(f"Invalid namespace {op.namespace!r}: non-empty labels without periods")
            if op.value is None:
                rows.append(StorePut(tuple(op.namespace), op.key, None))
                texts.append([])
                continue
            if not isinstance(op.value, dict):
                raise InvalidMemoryArgument("value", f"must be a dict, got {type(op.value).__name__}")
            if op.index is False:
                found = []
            else:
                paths = self._fields if op.index is None else [_path(p) for p in op.index]
                found = [t for _, path in paths for t in get_text_at_path(op.value, path)]
            texts.append(found)
            rows.append(
                StorePut(
                    tuple(op.namespace), op.key, op.value, text="\n".join(found), ttl_minutes=getattr(op, "ttl", None)
                )
            )
        # With an `index` of its own, the store embeds as LangGraph's stores do, before the write: one
        # vector per indexed text (a search scores an item by its best one); on Engram's embedder, items
        # are embedded after their commit by its embedding worker (off the write path, batched with
        # other writes; one vector of the item's text), and a query search finds them by words meanwhile.
        wanted = [i for i, row in enumerate(rows) if row.value is not None and texts[i]]
        if self._embed is not None and wanted:
            vectors = iter(self._embed.embed_documents([t for i in wanted for t in texts[i]]))
            for i in wanted:
                row = rows[i]
                stacked = np.asarray([next(vectors) for _ in texts[i]], dtype=np.float32)
                rows[i] = StorePut(
                    row.namespace,
                    row.key,
                    row.value,
                    text=row.text,
                    embedding=stacked.tobytes(),
                    ttl_minutes=row.ttl_minutes,
                )
        return rows

    def _search(self, op):
        query_vector = None
        if op.query:
            embedder = self._embedder()
            if embedder is not None:
                query_vector = embedder[1](op.query)
        found = self._memory.store_search(
            tuple(op.namespace_prefix),
            filter=op.filter,
            limit=op.limit,
            offset=op.offset,
            query=op.query or "",
            query_vector=query_vector,
            hybrid=self._embed is None,  # with an `index` of its own: ordered by the cosine alone, as LangGraph's
            refresh_ttl=op.refresh_ttl,
        )
        return [_item(SearchItem, item, score=score) for item, score in found]

    def _list_namespaces(self, op):
        prefix = suffix = None
        for condition in op.match_conditions or ():
            if condition.match_type == "prefix":
                prefix = tuple(condition.path)
            elif condition.match_type == "suffix":
                suffix = tuple(condition.path)
            else:
                raise ValueError(f"Unsupported match type: {condition.match_type}")
        return self._memory.store_namespaces(
            prefix=prefix, suffix=suffix, max_depth=op.max_depth, limit=op.limit, offset=op.offset
        )


def _check_labels(namespace):
    """As LangGraph's stores check a namespace they read: string labels, no period, no NUL."""
    for label in namespace:
        if not isinstance(label, str) or "." in label or "\x00" in label:
            raise InvalidNamespaceError(f"Invalid namespace label {label!r} in {namespace!r}: a string without '.'")


def _path(path):
    """(path, what get_text_at_path takes): "$" (the whole value) stays a string, others are tokenized."""
    return path, path if path == "$" else tokenize_path(path)


def _item(cls, row, **extra):
    return cls(
        namespace=split(row.namespace),
        key=row.key,
        value=row.value,
        created_at=row.created_at,
        updated_at=row.updated_at,
        **extra,
    )
