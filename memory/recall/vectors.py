"""In-process vector index: one float32 matrix per owner, kept in step with the database by generation.

Each owner (a fact's scope_key, an episode's or procedure's owner; see RecallDocument) has a row in
memory_recall_scope whose `generation` moves on, by trigger, whenever one of its documents gets a
new embedding or owner, and each such document is stamped with that generation (`vector_seq`). Before
a recall the service reads the generations of the viewer's owners (one query, shared with resolving
the viewer) and hands them to `sync`, which loads only the documents stamped after what this process
last saw. Writers of one owner are serialised by that counter row, so generation order is commit
order. Requests of one process read their generations at different times: one that read before
another synced newer ones hands `sync` an older generation than the index has. That is checked
against the database (one query), not taken for a restored database, which rebuilds the owner (a
million documents: 15-20 s, which every concurrent recall waited for). Documents that left an
owner (deleted or moved; counted in `removed`) stay in its matrix as stale rows until many have
gone, then the owner is reloaded: recall checks every candidate against the database, so a stale
row can cost a candidate slot, never return a hidden or deleted item.

The scan: an owner of up to EXACT_ROWS documents is scanned exactly (one float32 matrix-vector
product, then a partial sort). A larger one is too big for that (1M x 384 float32 is 1.5 GB: one
exact product reads all of it, far too slow for a recall), so it is searched in two stages: every
vector also keeps its sign bits (48 bytes for 384 dimensions, 48 MB per million), the Hamming
distance of the query's sign bits to all of them picks a shortlist of max(SHORTLIST_MIN, n *
SHORTLIST_FACTOR) rows, and those are ranked by their exact float32 cosine. The shortlist is an
approximation (a true top-n vector whose sign bits differ a lot from the query's can be missed); the
cosines returned are exact.
"""

import collections
import itertools
import operator
import sys
import threading

import numpy as np
from django.core.exceptions import ImproperlyConfigured

from ..backends.rows import fetch_in_chunks
from ..conf import memory_settings, on_memory_settings_changed
from ..embedding.embedder import from_blobs, model_resident_bytes
from ..models.workspaces import DEFAULT_WORKSPACE_ID

_DOC_TABLE = "memory_recall_doc"
_FETCH = 10_000
_OWNERS_PER_LOAD = 200  # owners one load statement may name (two parameters each)
# Reload an owner once this share of its rows (and at least _RELOAD_MIN rows) are known stale.
_RELOAD_SHARE = 0.2
_RELOAD_MIN = 1_000
EXACT_ROWS = 20_000
SHORTLIST_MIN = 2_000
SHORTLIST_FACTOR = 10
_CHUNK_ROWS = 32_768
# An id map entry's two int objects beyond the dict's own table (sys.getsizeof counts that).
_ENTRY_BYTES = 64


def sign_words(matrix, words):
    """Each row's sign bits (> 0) packed into `words` uint64 words."""
    bits = np.packbits(matrix > 0, axis=1)
    padded = np.zeros((bits.shape[0], words * 8), dtype=np.uint8)
    padded[:, : bits.shape[1]] = bits
    return padded.view(np.uint64)


class OwnerMatrix:
    """The embedded documents of one owner: ids, unit vectors, and where each id sits."""

    def __init__(self, dimension):
        self.dimension = dimension
        self.lock = threading.Lock()  # held while it loads, changes or is searched (VectorIndex)
        self.users = 0  # syncs under way that asked for it: not evicted meanwhile
        self.charged = 0  # the bytes the index counts for it
        self.clear()

    def clear(self):
        """Empty (to be loaded afresh)."""
        dimension = self.dimension
        self.ids = np.zeros(0, dtype=np.int64)
        self.spaces = np.zeros(0, dtype=np.int64)  # each row's workspace (of its document)
        self.vectors = np.zeros((0, dimension), dtype=np.float32)
        self.words = (dimension + 63) // 64
        # Sign bits, one row of uint64 words per 64 dimensions (word-major: each word's column is contiguous).
        self.signs = np.zeros((self.words, 0), dtype=np.uint64)
        self.size = 0
        self.row_of = {}  # doc id -> its row, or a tuple of rows (one per piece)
        self.generation = 0
        self.removed = 0
        self.stale = 0

    def nbytes(self):
        """What it holds: its arrays (their capacity, allocated) and its id map (estimated)."""
        arrays = self.ids.nbytes + self.spaces.nbytes + self.vectors.nbytes + self.signs.nbytes
        return arrays + sys.getsizeof(self.row_of) + _ENTRY_BYTES * len(self.row_of)

    def _grow(self, needed):
        capacity = len(self.ids)
        if self.size + needed <= capacity:
            return
        # Geometric growth from what is needed, with no floor: a fixed floor would make every owner
        # allocate and zero a large matrix however few its documents, and a store has many small
        # owners (the embedding worker's first links load thousands of them at once).
        new_capacity = max(self.size + needed, int(capacity * 1.5))
        ids = np.full(new_capacity, -1, dtype=np.int64)
        spaces = np.zeros(new_capacity, dtype=np.int64)
        vectors = np.zeros((new_capacity, self.dimension), dtype=np.float32)
        signs = np.zeros((self.words, new_capacity), dtype=np.uint64)
        ids[: self.size] = self.ids[: self.size]
        spaces[: self.size] = self.spaces[: self.size]
        vectors[: self.size] = self.vectors[: self.size]
        signs[:, : self.size] = self.signs[:, : self.size]
        self.ids, self.spaces, self.vectors, self.signs = ids, spaces, vectors, signs

    def rows(self, doc_id):
        """The rows of a document: one per piece of its text (memory.embedding.embedder.split_pieces)."""
        rows = self.row_of.get(doc_id, ())
        return (rows,) if isinstance(rows, int) else rows

    def _retire(self, rows):
        for row in rows:
            self.ids[row] = -1
            self.vectors[row] = 0.0
        self.stale += len(rows)

    def apply(self, doc_ids, blobs, spaces=None):
        """Put these documents' current vectors in (a None blob takes the document out); `spaces`:
        each document's workspace (None: all of the default workspace).

        A blob holds one vector per piece of the document's text; a document keeps its rows where it
        has as many pieces as before (an episode with a new message reuses its rows and adds one).
        """
        row_bytes = 4 * self.dimension
        if spaces is None:
            spaces = [DEFAULT_WORKSPACE_ID] * len(doc_ids)
        if self.row_of.keys().isdisjoint(doc_ids) and all(b is not None and len(b) == row_bytes for b in blobs):
            self._append(doc_ids, blobs, spaces)
            return
        self._grow(sum(len(b) // row_bytes for b in blobs if b is not None))
        rows, kept = [], []
        for doc_id, blob, space in zip(doc_ids, blobs, spaces):
            old = self.rows(doc_id)
            if blob is None:
                self.row_of.pop(doc_id, None)
                self._retire(old)
                continue
            n = len(blob) // row_bytes
            self._retire(old[n:])
            mine = list(old[:n])
            while len(mine) < n:
                mine.append(self.size)
                self.ids[self.size] = doc_id
                self.size += 1
            self.spaces[mine] = space
            self.row_of[doc_id] = mine[0] if n == 1 else tuple(mine)
            rows += mine
            kept.append(blob)
        if kept:
            self._write(np.asarray(rows, dtype=np.int64), kept)

    def _append(self, doc_ids, blobs, spaces):
        """New documents of one piece each (the common case: an owner's first load, a million of them
        at once): no per-row Python, which would hold the interpreter from the process's requests."""
        if not doc_ids:
            return
        self._grow(len(doc_ids))
        start, end = self.size, self.size + len(doc_ids)
        self.ids[start:end] = doc_ids
        self.spaces[start:end] = spaces
        self.row_of.update(zip(doc_ids, range(start, end)))
        self.size = end
        self._write(slice(start, end), blobs)

    def _write(self, rows, blobs):
        """Store these blobs' vectors (one piece each, in order) and their sign bits at these rows
        (a slice, or an array of row numbers)."""
        matrix = from_blobs(blobs, self.dimension)
        self.vectors[rows] = matrix
        self.signs[:, rows] = sign_words(matrix, self.words).T

    def top(self, query, n, workspace=None):
        """(doc ids, cosines) of the n best documents, best first; a document scores its best piece.

        `workspace`: of that workspace's documents only (an owner's documents may be of several
        workspaces: agent, session and global owners are the same text in each), so another
        workspace's never take one of the n places; None: of every workspace.
        """
        if self.size == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        mine = None if workspace is None else self.spaces[: self.size] == workspace
        if self.size <= EXACT_ROWS:
            scores = self.vectors[: self.size] @ query
            if mine is None:
                return self._best(np.arange(self.size), scores, n)
            rows = np.flatnonzero(mine)
            return self._best(rows, scores[rows], n)
        rows = self._shortlist(query, max(SHORTLIST_MIN, n * SHORTLIST_FACTOR), mine)
        if mine is not None:
            rows = rows[mine[rows]]
        return self._best(rows, self.vectors[rows] @ query, n)

    def top_many(self, queries, n, workspace=None):
        """`top` of each row of `queries`: one matrix product for the lot where the owner is scanned exactly."""
        if self.size == 0 or self.size > EXACT_ROWS:
            return [self.top(query, n, workspace) for query in queries]
        scores = self.vectors[: self.size] @ queries.T
        if workspace is None:
            rows = np.arange(self.size)
        else:
            rows = np.flatnonzero(self.spaces[: self.size] == workspace)
            scores = scores[rows]
        return [self._best(rows, scores[:, j], n) for j in range(len(queries))]

    def _best(self, rows, scores, n):
        if len(rows) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        ids = self.ids[rows]
        # The best k rows hold the best n documents once they name n distinct ones (a document's
        # other pieces can crowd the first n rows): widen k until they do.
        k = n
        while True:
            k = min(k, len(rows))
            best = np.argpartition(-scores, k - 1)[:k] if k < len(rows) else np.arange(len(rows))
            best = best[np.argsort(-scores[best], kind="stable")]
            best = best[ids[best] >= 0]
            _, first = np.unique(ids[best], return_index=True)
            best = best[np.sort(first)]
            if len(best) >= n or k == len(rows):
                best = best[:n]
                return ids[best], scores[best]
            k *= 4

    def _shortlist(self, query, m, mine=None):
        """The (about) m rows whose sign bits are nearest the query's, by Hamming distance; with
        `mine` (a mask of rows), rows outside it count as farther than any inside.

        Computed in cache-sized chunks (xor, popcount, sum per row); the rows are then those at or
        under the distance whose cumulative count reaches m (ties make it a few more).
        """
        q = sign_words(query[None, :], self.words)[0][:, None]
        distance = np.empty(self.size, dtype=np.uint16)
        chunk = _CHUNK_ROWS
        xor = np.empty((self.words, chunk), dtype=np.uint64)
        bits = np.empty((self.words, chunk), dtype=np.uint8)
        for lo in range(0, self.size, chunk):
            hi = min(self.size, lo + chunk)
            n = hi - lo
            np.bitwise_xor(self.signs[:, lo:hi], q, out=xor[:, :n])
            np.bitwise_count(xor[:, :n], out=bits[:, :n])
            np.sum(bits[:, :n], axis=0, dtype=np.uint16, out=distance[lo:hi])
        if m >= self.size:
            return np.arange(self.size)
        farthest = self.words * 64
        if mine is not None:
            distance[~mine] = farthest + 1
        cumulative = np.cumsum(np.bincount(distance, minlength=farthest + 2))
        threshold = int(np.searchsorted(cumulative, m))
        return np.flatnonzero(distance <= threshold)

    def cosines(self, doc_ids, query):
        """{doc id: cosine of its best piece} for the given ids this owner holds."""
        rows = [(d, r) for d in doc_ids for r in self.rows(d)]
        if not rows:
            return {}
        scores = self.vectors[[r for _, r in rows]] @ query
        result = {}
        for (d, _), score in zip(rows, scores.tolist()):
            result[d] = max(score, result.get(d, -2.0))
        return result


class VectorIndex:
    """Per-owner matrices of one dimension, shared by the threads of a process, within a byte cap.

    Locks: `_lock` guards only the bookkeeping (which owners are held, their order of use, the byte
    count, the counters) and is never held while a matrix loads or is searched; each matrix has its
    own lock, held while it loads, changes or is searched. A cold owner of a million documents takes
    seconds to load: under one process-wide lock every recall of the process waited for it (p95
    4.7 s with a 50,000-vector owner), now only the recalls that need that owner do, and they wait
    for the one load, not one each.

    MEMORY["VECTOR_CACHE_MB"] caps the bytes of the matrices held (their arrays and id maps) together
    with the bundled model's, when this process runs it (its resident size, measured when it loaded:
    memory.embedding.embedder.model_resident_bytes): the memory a process adds to its fixed part
    (Python, Django and the apps) stays within the cap whatever the cache holds. Before
    a load, owners not in use are evicted least recently used until the estimated bytes fit; after
    it, the estimate is settled against what was allocated and the cap enforced again. The owners
    of the sync under way, and those another thread is loading or searching, are never evicted, so
    an owner larger than the cap is kept alone (everything else makes way for it) until another
    owner's load needs the room: a recall always searches every owner it asked for, and the held
    bytes stay under max(the vectors' share of the cap, the largest owner in use). An owner evicted between a recall's sync
    and its search is loaded again by the search (from the generations that sync was given).
    """

    def __init__(self, dimension):
        self.dimension = dimension
        self.owners = collections.OrderedDict()  # owner -> OwnerMatrix, least recently used first
        self._lock = threading.Lock()
        self._local = threading.local()  # the states of each thread's last sync (for a reload in search)
        self.bytes = 0
        self.hits = self.misses = self.loads = self.evictions = 0

    # ---- bookkeeping (under self._lock)

    def _resolve(self, owner, use=True):
        """The owner's matrix, made (a miss) or found (a hit) and marked most recently used."""
        matrix = self.owners.get(owner)
        if matrix is None:
            self.misses += 1
            matrix = self.owners[owner] = OwnerMatrix(self.dimension)
            matrix.charged = matrix.nbytes()
            self.bytes += matrix.charged
        else:
            self.hits += 1
            self.owners.move_to_end(owner)
        if use:
            matrix.users += 1
        return matrix

    def _settle(self, owner, matrix, extra=0, keep=()):
        """Count `matrix`'s bytes (plus `extra` about to be loaded) and evict until they fit the cap."""
        if self.owners.get(owner) is matrix:
            charge = matrix.nbytes() + extra
            self.bytes += charge - matrix.charged
            matrix.charged = charge
        self._evict(keep)

    def _evict(self, keep):
        limit = vectors_cap_bytes()
        if limit is None or self.bytes <= limit:
            return
        for owner in list(self.owners):
            matrix = self.owners[owner]
            if owner in keep or matrix.users or matrix.lock.locked():
                continue  # in use here or in another thread: evicting it would only load it again
            del self.owners[owner]
            self.bytes -= matrix.charged
            self.evictions += 1
            if self.bytes <= limit:
                return

    def stats(self):
        """The cache's figures for /healthz: bytes held, cap, the model's bytes counted in the cap (what
        the vectors may hold is the cap less those), owners held, hits, misses, loads, evictions."""
        cap = cap_bytes()
        with self._lock:
            return {
                "bytes": int(self.bytes),
                "cap_bytes": cap,
                "model_bytes": model_resident_bytes(),
                "owners": len(self.owners),
                "hits": self.hits,
                "misses": self.misses,
                "loads": self.loads,
                "evictions": self.evictions,
            }

    # ---- loading

    def sync(self, states):
        """Bring the given owners up to date. `states`: {owner: (generation, removed)} from the database.

        Returns how many documents were (re)loaded.
        """
        states = {owner: (generation or 0, removed or 0) for owner, (generation, removed) in states.items()}
        self._local.states = states
        with self._lock:
            matrices = {owner: self._resolve(owner) for owner in states}
        try:
            return self._sync(states, matrices)
        finally:
            # Not evicted now even if over the cap: the recall that synced them searches them next.
            with self._lock:
                for matrix in matrices.values():
                    matrix.users -= 1

    def _sync(self, states, matrices):
        behind = {}  # owner -> (its matrix, the generation to reach)
        for owner, (generation, removed) in states.items():
            matrix = matrices[owner]
            with matrix.lock:  # waits only for a load of this owner under way in another thread
                if generation < matrix.generation or removed < matrix.removed:
                    # Counters older than the index's: most often read by a request before another one
                    # of this process synced newer ones (its own read is stale, the index is not), else
                    # the database was restored or rebuilt. Asked again, the database tells which.
                    generation, removed = _counters(owner)
                    if generation < matrix.generation or removed < matrix.removed:  # went back: start over
                        matrix.clear()
                gone = removed - matrix.removed
                if matrix.stale + gone >= max(_RELOAD_MIN, _RELOAD_SHARE * max(matrix.size, 1)):
                    matrix.clear()  # loaded afresh below: none of its rows is stale
                else:
                    matrix.stale += gone
                matrix.removed = removed
                if generation != matrix.generation:
                    behind[owner] = (matrix, generation)
        return self._load(behind, set(states))

    def _load(self, behind, keep):
        """Load the documents stamped after each owner's generation in the index.

        Owners with little to load share a statement: the embedding worker's first links after a
        start load hundreds of small owners, and one statement each cost a fifth of that load. An
        owner with more than _FETCH to load (its generation counts its vector changes) reads alone,
        in its index's order, which needs no sort. Each statement runs holding the locks of its
        owners only (taken in owner order, so two syncs never wait for each other in a circle).
        """
        groups, group, expected = [], [], 0
        for owner, (matrix, generation) in sorted(behind.items()):
            todo = max(generation - matrix.generation, 0)
            if todo > _FETCH:
                groups.append([owner])
                continue
            if group and (expected + todo > _FETCH or len(group) >= _OWNERS_PER_LOAD):
                groups.append(group)
                group, expected = [], 0
            group.append(owner)
            expected += todo
        if group:
            groups.append(group)
        loaded = 0
        row_bytes = self.dimension * 4 + 16 + 8 * ((self.dimension + 63) // 64) + _ENTRY_BYTES
        for owners in groups:
            locks = [behind[owner][0].lock for owner in owners]
            for lock in locks:
                lock.acquire()
            try:
                # Another thread may have loaded some of these while this one waited: only what is left.
                since = {o: behind[o][0].generation for o in owners if behind[o][0].generation < behind[o][1]}
                if not since:
                    continue
                with self._lock:
                    for owner in since:
                        matrix, generation = behind[owner]
                        self._settle(owner, matrix, max(generation - since[owner], 0) * row_bytes, keep)
                loaded += self._fetch(since, behind)
                with self._lock:
                    for owner in since:
                        matrix, generation = behind[owner]
                        matrix.generation = generation
                        self.loads += 1
                        self._settle(owner, matrix, 0, keep)
            finally:
                for lock in locks:
                    lock.release()
        return loaded

    def _fetch(self, since, behind):
        where = " OR ".join(["(owner = %s AND vector_seq > %s)"] * len(since))
        loaded = 0
        for rows in fetch_in_chunks(
            f"SELECT owner, id, embedding, workspace_id FROM {_DOC_TABLE} WHERE {where} ORDER BY owner, vector_seq, id",
            [value for owner, generation in since.items() for value in (owner, generation)],
            _FETCH,
        ):
            for owner, owned in itertools.groupby(rows, key=operator.itemgetter(0)):
                owned = list(owned)
                behind[owner][0].apply([r[1] for r in owned], [r[2] for r in owned], [r[3] for r in owned])
            loaded += len(rows)
        return loaded

    # ---- searching

    def _held(self, owners):
        """{owner: matrix} of these owners, loading again any the last sync of this thread had and
        another thread's load evicted since."""
        with self._lock:
            found = {o: self.owners[o] for o in owners if o in self.owners}
            for owner in found:
                self.owners.move_to_end(owner)
        states = getattr(self._local, "states", {})
        lost = {o: states[o] for o in owners if o not in found and o in states}
        if lost:
            self.sync(lost)
            with self._lock:
                found.update({o: self.owners[o] for o in lost if o in self.owners})
            self._local.states = states
        return found

    def search(self, owners, query, n, workspace=None):
        """The n best (doc id, cosine) over the given owners' matrices, best first, ids unique;
        `workspace`: of its documents only (OwnerMatrix.top)."""
        found = {}
        for matrix in self._held(owners).values():
            with matrix.lock:  # a sync may be growing this matrix in another thread
                ids, scores = matrix.top(query, n, workspace)
            for doc_id, score in zip(ids.tolist(), scores.tolist()):
                if score > found.get(doc_id, -2.0):
                    found[doc_id] = score
        return sorted(found.items(), key=lambda item: -item[1])[:n]

    def search_owner(self, owner, queries, n, workspace=None):
        """For each row of `queries`: the n best (doc id, cosine) of one owner (of one workspace's
        documents: OwnerMatrix.top), best first."""
        matrix = self._held([owner]).get(owner)
        if matrix is None:
            return [[] for _ in queries]
        with matrix.lock:
            return [list(zip(ids.tolist(), scores.tolist())) for ids, scores in matrix.top_many(queries, n, workspace)]

    def cosines(self, owners, doc_ids, query):
        result = {}
        for matrix in self._held(owners).values():
            with matrix.lock:
                result.update(matrix.cosines(doc_ids, query))
        return result


def cap_bytes():
    """MEMORY["VECTOR_CACHE_MB"] in bytes; None: no cap."""
    cap = memory_settings.VECTOR_CACHE_MB
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, int | float) or cap < 0:
        raise ImproperlyConfigured(f'MEMORY["VECTOR_CACHE_MB"] must be a number of megabytes >= 0 or None, not {cap!r}')
    return int(cap * 1024 * 1024)


def vectors_cap_bytes():
    """What the vectors may hold: the cap less the bundled model's resident size in this process (0
    when the model alone is larger: only the owners in use are kept); None: no cap."""
    cap = cap_bytes()
    return None if cap is None else max(cap - model_resident_bytes(), 0)


def _counters(owner):
    """The owner's (generation, removed) as the database has them now; (0, 0) for an owner without a row."""
    from ..models import RecallScope

    return RecallScope.objects.filter(owner=owner).values_list("generation", "removed").first() or (0, 0)


_index_lock = threading.Lock()
_index = None


_blas_limited = False


def _limit_blas_threads():
    global _blas_limited
    threads = memory_settings.VECTOR_BLAS_THREADS
    if threads and not _blas_limited:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=int(threads), user_api="blas")
        _blas_limited = True


def get_vector_index(dimension):
    """The process's vector index for vectors of this dimension (a new one if the dimension changed)."""
    global _index
    with _index_lock:
        if _index is None or _index.dimension != dimension:
            _limit_blas_threads()
            _index = VectorIndex(dimension)
        return _index


def cache_stats():
    """The process's vector cache figures (VectorIndex.stats), zeros before its first recall."""
    with _index_lock:
        index = _index
    if index is None:
        index = VectorIndex(0)
    return index.stats()


def reset_vector_index():
    global _index
    with _index_lock:
        _index = None


on_memory_settings_changed(reset_vector_index)
