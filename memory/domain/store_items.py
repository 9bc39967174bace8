"""Items of LangGraph stores (workflows.store.EngramStore), owned like every other memory. MemoryService delegates to it.

A namespace is a tuple of labels; its owner follows from its head (StoreItemsMixin.store_owner): a
person's namespace is theirs (isolated to them, exported with them, deleted when they are forgotten),
("agents", "<agent id>", ...) that agent's, anything else everyone's (global). Filters follow
LangGraph's stores: a value matches `{"field": value}` when equal (nested objects and lists
compared whole), and `{"field": {"$gt": 3}}` with $eq, $ne, $gt, $gte, $lt, $lte.
"""

import functools
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ..backends.store_rows import SEARCH_NAMES, STORE_NAMES, ScoredItem, StoredItem, pushable
from ..conf import memory_settings
from ..exceptions import InvalidMemoryArgument
from ..models import DeletionKind, MemoryUser, Scope, StoreItem
from ..models.workspaces import workspace_default
from ..recall.indexer import STORE, indexer
from ..rules.validation import check_id_list, check_json, chunks, clean_text
from ..text import keyword_terms
from . import limits
from .deletions import BatchDelete, existing_ids, write_deletion_record

SEPARATOR = "."
# How much of a hybrid query search's order (never its score) the words decide when vectors are there
# too (the rest: the cosine).
KEYWORD_SHARE = 0.3
_OPERATORS = {
    "$eq": lambda a, b: a == b,
    "$ne": lambda a, b: a != b,
    "$gt": lambda a, b: float(a) > float(b),
    "$gte": lambda a, b: float(a) >= float(b),
    "$lt": lambda a, b: float(a) < float(b),
    "$lte": lambda a, b: float(a) <= float(b),
}


@dataclass(frozen=True)
class StorePut:
    """One write: `value` None deletes. `text` and `embedding` (float32 bytes) are what searches match."""

    namespace: tuple
    key: str
    value: dict | None
    text: str = ""
    embedding: bytes | None = None
    ttl_minutes: float | None = None


def joined(namespace):
    return SEPARATOR.join(namespace)


@functools.lru_cache(maxsize=4096)
def split(namespace):
    """The labels of a joined namespace (cached: a search splits the same few namespaces for every item)."""
    return tuple(namespace.split(SEPARATOR))


def _prefix_filter(prefix):
    """Items whose namespace starts with the labels `prefix`, as an index range (no LIKE)."""
    if not prefix:
        return Q()
    text = joined(prefix)
    # "/" sorts right after ".": every "<prefix>.<more>" lies in [<prefix>., <prefix>/).
    return Q(namespace=text) | Q(namespace__gte=text + SEPARATOR, namespace__lt=text + "/")


def value_at(value, key):
    """value[key], or for a dotted key ("user.access-level") the value down that path (None if absent)."""
    if key in value or "." not in key:
        return value.get(key)
    for part in key.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def matches(value, wanted):
    """Whether a stored value meets a LangGraph filter value (see the module docstring)."""
    if isinstance(wanted, dict):
        if any(k.startswith("$") for k in wanted):
            try:
                return all(_OPERATORS[op](value, operand) for op, operand in wanted.items())
            except KeyError as exc:
                raise InvalidMemoryArgument("filter", f"unknown operator {exc.args[0]!r}") from None
            except (TypeError, ValueError):
                return False
        return isinstance(value, dict) and all(matches(value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, (list, tuple)):
        return (
            isinstance(value, (list, tuple))
            and len(value) == len(wanted)
            and all(matches(a, b) for a, b in zip(value, wanted))
        )
    return value == wanted


RESERVED_HEAD = "engram"  # ("engram", "users", "<memory user id>", ...): Engram's own ids, named explicitly


class StoreItems:
    """What EngramStore asks of the memory; MemoryService builds it and delegates."""

    def __init__(self, backend, users):
        self.backend = backend
        self.users = users

    def store_owner(self, namespace):
        """{"scope", "user_id", "agent_id"} of a namespace.

        - ("engram", "users", "<memory user id>", ...): that memory user (the survivor if merged); the
          only namespace that names Engram's own ids, so an application's numeric ids never collide with them.
        - (<label>, X, ...) where MEMORY["STORE_NAMESPACES"] maps <label> to a channel (by default "users"
          and langmem's "memories" to "langgraph"): the person whose identity on that channel is X, created
          with that identity at the first write (so forgetting, exporting and listing a person cover their
          items from the start), or found through an identity linked to them (`memory users link`).
        - ("agents", "<agent id>", ...): that agent. Anything else: everyone (global).
        """
        if namespace and namespace[0] == RESERVED_HEAD:
            return {"scope": Scope.USER, "user_id": self._engram_user(namespace), "agent_id": ""}
        channel = memory_settings.STORE_NAMESPACES.get(namespace[0]) if len(namespace) >= 2 else None
        if channel:
            try:
                user, _ = self.users.get_or_create_user(channel, namespace[1])
            except InvalidMemoryArgument as exc:  # named as the caller wrote it: the namespace's label
                raise InvalidMemoryArgument("namespace", f"{namespace[1]!r} as a {channel} id: {exc.message}") from None
            return {"scope": Scope.USER, "user_id": user.pk, "agent_id": ""}
        if len(namespace) >= 2 and namespace[0] == "agents":
            return {
                "scope": Scope.AGENT,
                "user_id": None,
                "agent_id": clean_text("namespace", namespace[1], max_length=128),
            }
        return {"scope": Scope.GLOBAL, "user_id": None, "agent_id": ""}

    def _engram_user(self, namespace):
        label = namespace[2] if len(namespace) >= 3 and namespace[1] == "users" else None
        if label is None or not (label.isascii() and label.isdigit() and 0 < int(label) < 2**63):
            raise InvalidMemoryArgument(
                "namespace",
                f"{namespace!r}: the label {RESERVED_HEAD!r} is reserved; use "
                f"({RESERVED_HEAD!r}, 'users', '<memory user id>', ...)",
            )
        found = MemoryUser.objects.filter(pk=int(label)).values_list("pk", "merged_into_id").first()
        if found is None:
            raise InvalidMemoryArgument("namespace", f"{namespace!r}: no memory user has id {label}")
        if found[1] is None:
            return found[0]
        return self.users.resolve_user(found[0]).pk

    def store_get_many(self, keys, *, refresh_ttl=True):
        """{(joined namespace, key): StoredItem} of these that exist and have not expired. One query (two with TTLs)."""
        if not keys:
            return {}
        now = timezone.now()
        items = []
        for chunk in chunks(sorted({(joined(namespace), key) for namespace, key in keys}), 400):
            items += _items(self.backend.store_rows_by_key(chunk, now))
        if refresh_ttl:
            _refresh(items, now)
        return {(i.namespace, i.key): i for i in items}

    def store_get_one(self, namespace, key, *, refresh_ttl=True):
        """The StoredItem at (namespace, key) if it exists and has not expired, else None. One query."""
        now = timezone.now()
        rows = self.backend.store_rows_by_key([(joined(namespace), key)], now)
        if not rows:
            return None
        item = _items(rows)[0]
        if refresh_ttl and item.ttl_minutes is not None:
            _refresh([item], now)
        return item

    def store_put_many(self, puts):
        """Write and delete items in one transaction (the last write of a key wins). No model is called here:
        items that come without a vector are embedded by the embedding worker once this commits."""
        latest = {(p.namespace, p.key): p for p in puts}
        owners = {}
        for namespace, key in latest:
            clean_text("key", key, max_length=255)
            if len(joined(namespace)) > 500:
                raise InvalidMemoryArgument("namespace", "is longer than 500 characters")
        for p in latest.values():
            if p.value is not None:
                if not isinstance(p.value, dict):
                    raise InvalidMemoryArgument("value", f"must be a dict, got {type(p.value).__name__}")
                check_json("value", p.value)
                owners[p.namespace] = owners.get(p.namespace) or self.store_owner(p.namespace)
        now = timezone.now()
        with transaction.atomic():
            gone = [(joined(ns), key) for (ns, key), p in latest.items() if p.value is None]
            for chunk in chunks(gone, 400):
                doomed = Q()
                for namespace, key in chunk:
                    doomed |= Q(namespace=namespace, key=key)
                StoreItem.objects.filter(doomed).delete()
            workspace_id = workspace_default()
            rows = [
                {
                    "workspace_id": workspace_id,
                    "namespace": joined(p.namespace),
                    "key": p.key,
                    "value": p.value,
                    "text": p.text,
                    "embedding": p.embedding,
                    "created_at": now,
                    "updated_at": now,
                    "ttl_minutes": p.ttl_minutes,
                    "expires_at": now + timedelta(minutes=p.ttl_minutes) if p.ttl_minutes is not None else None,
                    **owners[p.namespace],
                }
                for p in latest.values()
                if p.value is not None
            ]
            ids = self.backend.store_upsert(rows)
            limits.enforce_store_items({joined(ns): owner["agent_id"] for ns, owner in owners.items()})
            # Items without a vector (Engram's embedder serves this store) get one after the commit.
            indexer.schedule(
                STORE, [ids[r["namespace"], r["key"]] for r in rows if r["embedding"] is None and r["text"]]
            )

    def store_search(
        self, prefix, *, filter=None, limit=10, offset=0, query="", query_vector=None, hybrid=True, refresh_ttl=True
    ):
        """[(StoredItem or ScoredItem, score)] under `prefix` meeting `filter`, best first for a query.

        Without a query: most recently updated first, score None. With one, the score is LangGraph's: the
        cosine of the query's vector and the item's (the best of an item's vectors), None for an item
        without a vector or without a `query_vector`. The order: by that cosine, unscored items last
        (as LangGraph's stores); with `hybrid`, like recall, by the cosine and the share of the query's
        words the item holds (KEYWORD_SHARE of the rank), so an item not embedded yet, or every item
        without an embedder, is still found by its words.
        """
        now = timezone.now()
        filter = filter or {}
        pushed = {name: wanted for name, wanted in filter.items() if pushable(name, wanted)}
        # Re-checked in Python unless the database's equality is exactly == for that value (SQLite's
        # json_extract also takes a nested object's JSON text for a string); a pushed filter is a plain
        # field and a scalar, for which `matches` is ==.
        recheck = {k: v for k, v in pushed.items() if not self.backend.store_equality_is_exact(v)}
        rest = {name: wanted for name, wanted in filter.items() if name not in pushed}
        exact = not (recheck or rest)  # the database decides every filter exactly: it can page too
        paged = exact and not query and limit >= 0 and offset >= 0
        rows = self.backend.store_rows_under(
            joined(prefix), now, pushed, offset + limit if paged else None, scored=bool(query)
        )
        items = _items(rows, SEARCH_NAMES if query else STORE_NAMES)
        candidates = (
            items
            if exact
            else [
                i
                for i in items
                if all(i.value.get(k) == v for k, v in recheck.items())
                and all(matches(value_at(i.value, k), v) for k, v in rest.items())
            ]
        )
        if not query:
            found = candidates[offset : offset + limit]
            if refresh_ttl:
                _refresh(found, now)
            return [(item, None) for item in found]
        scored = _scores(candidates, query, query_vector, hybrid)
        ranked = sorted(scored, key=lambda row: (row[1] is None, -(row[1] or 0.0)))[offset : offset + limit]
        if refresh_ttl:
            _refresh([item for item, _, _ in ranked], now)
        return [(item, score) for item, _, score in ranked]

    def store_namespaces(self, *, prefix=None, suffix=None, max_depth=None, limit=100, offset=0):
        """The distinct namespaces (cut to `max_depth`) matching `prefix` / `suffix` ("*" matches any label), sorted."""
        fixed = joined(prefix) if prefix and "*" not in prefix else ""
        found = set()
        for text in self.backend.store_namespace_names(fixed, timezone.now()):
            namespace = split(text)
            if prefix and not _labels_match(namespace[: len(prefix)], prefix, len(namespace) >= len(prefix)):
                continue
            if suffix and not _labels_match(namespace[-len(suffix) :], suffix, len(namespace) >= len(suffix)):
                continue
            found.add(namespace[:max_depth] if max_depth is not None else namespace)
        return sorted(found)[offset : offset + limit]

    def sweep_store_items(self):
        """Delete expired store items; returns how many went."""
        deleted, _ = StoreItem.objects.filter(expires_at__lte=timezone.now()).delete()
        return deleted

    def store_item_list(self):
        """Every store item, for operators."""
        return StoreItem.objects.select_related("user")

    def delete_store_items(self, ids, *, max_ids=None, actor=""):
        """Delete store items by id in one transaction; returns BatchDelete(deleted, not_found)."""
        ids = check_id_list(ids, max_ids)
        with transaction.atomic():
            found = existing_ids(StoreItem, ids)
            for chunk in chunks(sorted(found)):
                StoreItem.objects.filter(pk__in=chunk).delete()
            if found:
                write_deletion_record(actor, DeletionKind.STORE_ITEMS, sorted(found))
        return BatchDelete(len(found), [i for i in ids if i not in found])


def check_imported_item(row):
    if not row["namespace"] or any(not label for label in row["namespace"].split(".")):
        return "namespace", "must be non-empty labels joined by '.'"
    owner = {"user": row["user_id"] is not None, "agent": bool(row["agent_id"])}
    wanted = {Scope.USER: "user", Scope.AGENT: "agent", Scope.GLOBAL: None}.get(row["scope"], "?")
    if wanted == "?" or any(present != (name == wanted) for name, present in owner.items()):
        return "scope", f"a {row['scope']} store item cannot have these owner columns"
    if not isinstance(row["value"], dict):
        return "value", "must be a JSON object"
    return None


def prepare_imported_item(row):
    # Vectors are not exported (they belong to one model); an imported item is found by its words
    # until it is written again (no model runs inside the import's transaction).
    row["embedding"] = None


def _items(rows, names=STORE_NAMES):
    """The rows as the service hands them out: StoredItem, or ScoredItem (with text and vector) for SEARCH_NAMES."""
    shape = ScoredItem if names is SEARCH_NAMES else StoredItem
    return rows if rows and type(rows[0]) is shape else [shape(*row) for row in rows]


def _alive(now):
    return Q(expires_at__isnull=True) | Q(expires_at__gt=now)


def _refresh(items, now):
    """Restart the TTL of items that have one (a read counts as use, as in LangGraph's stores)."""
    timed = {}
    for item in items:
        if item.ttl_minutes is not None:
            timed.setdefault(item.ttl_minutes, []).append(item.pk)
    for minutes, pks in timed.items():
        StoreItem.objects.filter(pk__in=pks).update(expires_at=now + timedelta(minutes=minutes))


def _labels_match(labels, pattern, long_enough):
    return long_enough and all(p == "*" or p == label for label, p in zip(labels, pattern))


def _scores(items, query, query_vector, hybrid):
    """[(item, rank, score)]: `score` as LangGraph's stores define it, the cosine of the query's vector and
    the item's (the best of its vectors: one per indexed text), None without both; `rank` orders them:
    the cosine alone, or with `hybrid` the cosine and the share of the query's words the item holds
    (KEYWORD_SHARE of it; the words alone for an item without a vector yet, or without any embedder)."""
    terms = set(keyword_terms(query)) if hybrid else set()
    vector = None if query_vector is None else np.asarray(query_vector, dtype=np.float32)
    if vector is not None:
        vector = vector / (np.linalg.norm(vector) or 1.0)
        cosines = _best_cosines([item.embedding for item in items], vector)
    else:
        cosines = [None] * len(items)
    scored = []
    for item, cosine in zip(items, cosines):
        if not hybrid:
            scored.append((item, cosine, cosine))
            continue
        words = set(keyword_terms(item.text, limit=10_000)) if item.text else set()
        keyword = len(terms & words) / len(terms) if terms and words else 0.0
        if cosine is not None:
            rank = (1 - KEYWORD_SHARE) * cosine + KEYWORD_SHARE * keyword
        else:
            rank = keyword if item.text else None
        scored.append((item, rank, cosine))
    return scored


def _best_cosines(embeddings, vector):
    """Per stored embedding (float32 vectors one after another, or None): the highest cosine of `vector`
    (unit length) and its vectors, as LangGraph's stores score an item indexed by several texts; None
    for one without vectors or with vectors of another size (made by another model: not comparable).

    The items with as many vectors as each other go through numpy together, as one stack: a handful of
    numpy calls per item cost far more than the arithmetic on a few hundred floats. The product of a
    stack and the vector takes each item's product as it would alone, so an item's score does not
    depend on which other items a search scored with it."""
    width = 4 * vector.size  # bytes of one float32 vector
    by_count = {}  # vectors an item holds -> [(its position, its bytes)]
    for i, embedding in enumerate(embeddings):
        blob = b"" if embedding is None else bytes(embedding)
        if blob and not len(blob) % width:
            by_count.setdefault(len(blob) // width, []).append((i, blob))
    cosines = [None] * len(embeddings)
    for count, members in by_count.items():
        joined = b"".join(blob for _, blob in members)
        stored = np.frombuffer(joined, dtype=np.float32).reshape(len(members), count, vector.size)
        norms = np.linalg.norm(stored, axis=2)
        norms[norms == 0] = 1.0  # a zero vector scores 0, as LangGraph's stores give it
        best = (stored @ vector / norms).max(axis=1)
        for (i, _), cosine in zip(members, best.tolist()):
            cosines[i] = cosine
    return cosines
