"""EngramStore: a LangGraph `BaseStore` on Engram's memory, for any graph or agent (`compile(store=...)`).

    store = EngramStore()                                   # Engram's embedder, if installed
    store = EngramStore(index={"dims": 384, "embed": my_embeddings, "fields": ["text"]})
    store = EngramStore(ttl={"default_ttl": 60, "refresh_on_read": True})

Items live in MemoryService's tables (memory/domain/store_items.py), owned by their namespace:
("users", "<user id>", ...) is that person's (MemoryService.store_owner: shown on their page in
/memories/, exported with them, deleted when they are forgotten), ("agents", "<agent id>", ...) that
agent's, anything else global. Query searches are hybrid: the cosine of the query's and the item's
vectors and the share of the query's words the item holds (memory.domain.store_items.KEYWORD_SHARE);
without an embedder, the words alone. No embedding model runs inside a database transaction: with
an `index`, values are embedded before their transaction; on Engram's embedder, after it commits.

The sync API also works when called from a coroutine (LangGraph's stores allow it; Django refuses
database work on an event loop's thread): the call then runs on a worker thread while the caller
waits. Async code should prefer the a-methods, which never block the loop.
"""

import asyncio
import functools
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

_OFF_THE_LOOP = ThreadPoolExecutor(max_workers=4, thread_name_prefix="engram-store")


def _off_the_event_loop(method):
    """Run a sync entry point on a worker thread when it is called on an event loop's thread."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return method(self, *args, **kwargs)
        return _OFF_THE_LOOP.submit(_closing_connection, method, self, *args, **kwargs).result()

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
        rows = []
        for op in puts:
            if not op.namespace or any(
                not isinstance(label, str) or not label or "." in label for label in op.namespace
            ):
                raise InvalidNamespaceError(f"Invalid namespace {op.namespace!r}: non-empty labels without periods")
            if op.value is None:
                rows.append(StorePut(tuple(op.namespace), op.key, None))
                continue
            if not isinstance(op.value, dict):
                raise InvalidMemoryArgument("value", f"must be a dict, got {type(op.value).__name__}")
            if op.index is False:
                text = ""
            else:
                paths = self._fields if op.index is None else [_path(p) for p in op.index]
                text = "\n".join(t for _, path in paths for t in get_text_at_path(op.value, path))
            rows.append(
                StorePut(tuple(op.namespace), op.key, op.value, text=text, ttl_minutes=getattr(op, "ttl", None))
            )
        # With an `index` of its own, the store embeds as LangGraph's stores do, before the write; on
        # Engram's embedder, items are embedded after their commit by its embedding worker (off the
        # write path, batched with other writes), and a query search finds them by words meanwhile.
        wanted = [i for i, row in enumerate(rows) if row.value is not None and row.text]
        if self._embed is not None and wanted:
            vectors = self._embed.embed_documents([rows[i].text for i in wanted])
            for i, vector in zip(wanted, vectors):
                row = rows[i]
                rows[i] = StorePut(
                    row.namespace,
                    row.key,
                    row.value,
                    text=row.text,
                    embedding=np.asarray(vector, dtype=np.float32).tobytes(),
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
