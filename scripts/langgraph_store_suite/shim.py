"""The name `SqliteStore` that LangGraph's SqliteStore tests import, bound to another store.

`STORE_UNDER_TEST` chooses: `engram` (EngramStore on the Django test database) or `inmemory`
(LangGraph's InMemoryStore, the reference). The connection string is ignored: every store opened
starts empty, as a new `:memory:` or temporary-file SqliteStore does.
"""

import contextlib
import os

from langgraph.store.memory import InMemoryStore

KIND = os.environ.get("STORE_UNDER_TEST", "engram")


def _index(index):
    """SqliteStore's index config in BaseStore's terms (`text_fields` is its name for `fields`)."""
    if not index:
        return None
    config = {"dims": index["dims"], "embed": index["embed"]}
    if index.get("text_fields"):
        config["fields"] = index["text_fields"]
    return config


class _InMemory(InMemoryStore):
    def setup(self):
        pass


def _engram(index, ttl):
    from memory.models import StoreItem
    from workflows.store import EngramStore

    class _Engram(EngramStore):
        def setup(self):
            pass

    # A fresh store: the items of a store opened earlier in the same test are not this one's.
    StoreItem.objects.all().delete()
    return _Engram(index=_index(index), ttl=ttl)


class SqliteStore:
    MIGRATIONS = ()

    @classmethod
    @contextlib.contextmanager
    def from_conn_string(cls, conn_string, *, index=None, ttl=None, **kwargs):
        if KIND == "inmemory":
            yield _InMemory(index=_index(index))
        else:
            yield _engram(index, ttl)
