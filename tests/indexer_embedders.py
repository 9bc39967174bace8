"""Embedders for the embedding worker's tests, importable by dotted path (also from a second process).

Each wraps LangChain's DeterministicFakeEmbedding (a real `Embeddings`): one refuses to run inside a
database transaction, one raises while a switch is on, one blocks until released (also as
ConceptEmbedding). ConceptEmbedding knows a few synonyms (for the tests of how recall fuses its two
legs).
"""

import threading

from django.db import connection
from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings

SIZE = 32
MODEL_ID = "fake-32"
calls_in_transaction = []
failing = threading.Event()
released = threading.Event()
released.set()


class TransactionCheckingEmbedding(DeterministicFakeEmbedding):
    """Notes every document embedding that runs while its thread's connection is inside a transaction."""

    def __init__(self, **kwargs):
        super().__init__(size=SIZE)

    def embed_documents(self, texts):
        if connection.in_atomic_block:
            calls_in_transaction.append(list(texts))
        return super().embed_documents(texts)


class FailingEmbedding(TransactionCheckingEmbedding):
    """Raises while `failing` is set (the dimension probe of embed_query always works)."""

    def embed_documents(self, texts):
        if failing.is_set():
            raise RuntimeError("the embedding service is down")
        return super().embed_documents(texts)


class BlockingEmbedding(TransactionCheckingEmbedding):
    """Blocks document embeddings until `released` is set: a model that hangs."""

    def embed_documents(self, texts):
        released.wait()
        return super().embed_documents(texts)


query_calls = []


class QueryCountingEmbedding(TransactionCheckingEmbedding):
    """Counts query embeddings (the dimension probe included)."""

    def embed_query(self, text):
        query_calls.append(text)
        return super().embed_query(text)


document_texts = []


class DocumentCountingEmbedding(TransactionCheckingEmbedding):
    """Notes every text given to the model as a document."""

    def embed_documents(self, texts):
        document_texts.extend(texts)
        return super().embed_documents(texts)


commit_modes = []


class CommitModeEmbedding(TransactionCheckingEmbedding):
    """Notes, for each document batch, its thread's PostgreSQL synchronous_commit (the worker's connection)."""

    def embed_documents(self, texts):
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SHOW synchronous_commit")
                commit_modes.append(cursor.fetchone()[0])
        return super().embed_documents(texts)


# Words that mean the same thing share a dimension; every other word is ignored (a text without any
# of them points along the last dimension). Recall's fusion tests use it as a model that knows
# "beverage" and "tea" are about drinks although they share no letters.
CONCEPTS = {
    "drink": ("beverage", "tea", "coffee", "drink"),
    "morning": ("morning",),
    "exercise": ("run", "yoga", "swim"),
    "work": ("meeting", "emails", "report"),
    "reading": ("news", "book", "paper"),
}


class ConceptEmbedding(Embeddings):
    """A tiny meaning-aware model: a text's vector counts its words per concept (normalised)."""

    def __init__(self, **kwargs):
        self.dimensions = {word: i for i, words in enumerate(CONCEPTS.values()) for word in words}

    def _embed(self, text):
        vector = [0.0] * (len(CONCEPTS) + 1)
        for word in text.lower().replace(":", " ").split():
            if word in self.dimensions:
                vector[self.dimensions[word]] += 1.0
        if not any(vector):
            vector[-1] = 1.0
        norm = sum(v * v for v in vector) ** 0.5
        return [v / norm for v in vector]

    def embed_documents(self, texts):
        return [self._embed(t) for t in texts]

    def embed_query(self, text):
        return self._embed(text)


class BlockingConceptEmbedding(ConceptEmbedding):
    """ConceptEmbedding that blocks document embeddings until `released` is set."""

    def embed_documents(self, texts):
        released.wait()
        return super().embed_documents(texts)


class FileCountingEmbedding(DeterministicFakeEmbedding):
    """Appends every text given to the model as a document, one line each, to the file named by
    ENGRAM_TEST_EMBED_LOG: the model calls of every process (Celery workers) in one place."""

    def __init__(self, **kwargs):
        super().__init__(size=SIZE)

    def embed_documents(self, texts):
        import os

        with open(os.environ["ENGRAM_TEST_EMBED_LOG"], "a") as log:
            log.writelines(text.replace("\n", " ") + "\n" for text in texts)
        return super().embed_documents(texts)


embedding_threads = []


class ThreadNotingEmbedding(ConceptEmbedding):
    """ConceptEmbedding that notes the name of the thread of every document embedding."""

    def embed_documents(self, texts):
        embedding_threads.append(threading.current_thread().name)
        return super().embed_documents(texts)
