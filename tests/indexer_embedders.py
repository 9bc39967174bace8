"""Embedders for the embedding worker's tests, importable by dotted path (also from a second process).

Each wraps LangChain's DeterministicFakeEmbedding (a real `Embeddings`): one refuses to run inside a
database transaction, one raises while a switch is on, one blocks until released.
"""

import threading

from django.db import connection
from langchain_core.embeddings import DeterministicFakeEmbedding

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
