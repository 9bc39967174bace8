"""The vector index's memory cap (MEMORY["VECTOR_CACHE_MB"]): least recently used owners evicted, an evicted
owner loaded again with the same answers, a cold owner's load blocking no other owner's recall, /healthz's
figures. memory/recall/vectors.py.

Big owners are seeded as rows of the recall index with random unit vectors (as another process's
embedding worker would have stored them): the index reads nothing else, and a model would take minutes.
"""

import threading
import time

import numpy as np
import pytest

from memory.models import MemoryUser, RecallDocument, RecallScope
from memory.recall.vectors import VectorIndex, get_vector_index, reset_vector_index

FAKE = {"EMBEDDINGS": "langchain_core.embeddings.DeterministicFakeEmbedding", "EMBEDDINGS_OPTIONS": {"size": 64}}
DIM = 64
WIDE = 4096


@pytest.fixture
def fake_embedder(settings):
    settings.MEMORY = {**getattr(settings, "MEMORY", {}), **FAKE}
    reset_vector_index()
    yield
    reset_vector_index()


def seed(owner, n, *, dim=DIM, first_item=0, seed=0):
    """n documents of `owner` with random unit vectors; returns the ids of the documents."""
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    docs = [
        RecallDocument(kind="fact", item_id=first_item + i, owner=owner, text="", embedding=vectors[i].tobytes())
        for i in range(n)
    ]
    RecallDocument.objects.bulk_create(docs, batch_size=2000)
    return vectors


def states(*owners):
    return {
        o: (g, r)
        for o, g, r in RecallScope.objects.filter(owner__in=owners).values_list("owner", "generation", "removed")
    }


def set_cap(settings, megabytes):
    settings.MEMORY = {**getattr(settings, "MEMORY", {}), "VECTOR_CACHE_MB": megabytes}


@pytest.mark.django_db(transaction=True)
def test_eviction_keeps_the_bytes_under_the_cap_and_drops_the_least_recently_used(settings):
    for i, owner in enumerate(["o1", "o2", "o3", "o4"]):
        seed(owner, 2000, first_item=i * 10_000, seed=i)
    probe = VectorIndex(DIM)
    set_cap(settings, None)
    probe.sync(states("o1"))
    one = probe.stats()["bytes"]
    cap = 2.5 * one / (1024 * 1024)  # two owners fit, three do not
    set_cap(settings, cap)
    index = VectorIndex(DIM)
    query = np.ones(DIM, dtype=np.float32) / np.sqrt(DIM)
    for owner in ["o1", "o2", "o3"]:
        index.sync(states(owner))
        assert index.stats()["bytes"] <= cap * 1024 * 1024
    assert list(index.owners) == ["o2", "o3"]  # o1, the least recently used, made way for o3
    index.search(["o2"], query, 5)  # o2 used again: o3 is now the least recent
    index.sync(states("o4"))
    assert list(index.owners) == ["o2", "o4"]
    stats = index.stats()
    assert stats["evictions"] == 2 and stats["owners"] == 2 and stats["bytes"] <= stats["cap_bytes"]
    assert stats["cap_bytes"] == int(cap * 1024 * 1024) and stats["misses"] == 4 and stats["loads"] == 4


@pytest.mark.django_db(transaction=True)
def test_an_owner_bigger_than_the_cap_is_kept_alone_and_searched_whole(settings):
    seed("small", 50, seed=1)
    big = seed("big", 3000, first_item=10_000, seed=2)
    set_cap(settings, 0.5)  # the big owner alone is about 1 MB
    index = VectorIndex(DIM)
    index.sync(states("small"))
    index.sync(states("big"))
    assert list(index.owners) == ["big"]
    ids = dict(RecallDocument.objects.filter(owner="big").values_list("item_id", "id"))
    [(hit, cosine)] = index.search(["big"], big[1234], 1)
    assert hit == ids[10_000 + 1234] and cosine > 0.999
    index.sync(states("small"))  # the next load needs the room: the big owner goes
    assert list(index.owners) == ["small"] and index.stats()["bytes"] <= 0.5 * 1024 * 1024


@pytest.mark.django_db(transaction=True)
def test_an_evicted_owner_is_loaded_again_and_recall_answers_the_same(service, fake_embedder, settings):
    users = [MemoryUser.objects.create(canonical_id=f"t:{i}") for i in range(3)]
    for user in users:
        for k in range(30):
            service.set_fact(f"k{k}", f"value {k} of {user.canonical_id} tea coffee", scope="user", user_id=user.pk)
    set_cap(settings, 0.001)  # about one user's facts: each recall evicts the others
    first = {
        u.pk: [(h.item.pk, h.vector_score) for h in service.recall("tea", user_id=u.pk, mode="vector")] for u in users
    }
    index = get_vector_index(DIM)
    assert index.stats()["evictions"] >= 2
    for user in users:  # each loaded again, and answering as before
        again = [(h.item.pk, h.vector_score) for h in service.recall("tea", user_id=user.pk, mode="vector")]
        assert again == first[user.pk] and len(again) == 10
    stats = index.stats()
    # Past the cap, only the last recall's owners are held (its user's, with the empty global and agent ones).
    held_users = [owner for owner in index.owners if owner.startswith("user:")]
    assert stats["loads"] >= 6 and held_users == [f"user:{users[-1].pk}"]
    assert stats["bytes"] == sum(matrix.charged for matrix in index.owners.values())


@pytest.mark.django_db(transaction=True)
def test_a_cold_owner_loading_does_not_block_a_recall_of_another_owner(settings):
    """While a big owner loads in one thread, recalls of a small owner keep answering in another: the
    load holds its owner's lock only (before, one process-wide lock made every recall wait for it)."""
    # Few wide vectors: a load of tens of megabytes, seeded in seconds (the triggers run per row).
    seed("big", 4000, dim=WIDE, seed=3)
    small = seed("small", 100, dim=WIDE, first_item=100_000, seed=4)
    index = VectorIndex(WIDE)
    index.sync(states("small"))
    big_state, small_state = states("big"), states("small")
    loading = threading.Thread(target=index.sync, args=(big_state,))
    loading.start()
    deadline = time.monotonic() + 30
    while "big" not in index.owners:  # its sync has begun: the load comes next
        assert time.monotonic() < deadline and loading.is_alive(), "the big owner's load never started"
    answered_during_load = 0
    while loading.is_alive():
        index.sync(small_state)
        found = index.search(["small"], small[7], 1)
        if loading.is_alive():  # answered while the big owner's load still ran
            answered_during_load += 1
        assert found[0][1] > 0.999
    print(f"recalls of the small owner answered during the big owner's load: {answered_during_load}")
    # Under one process-wide lock the first of these waited for the whole load (and at most that one
    # could count, in the moment between the load and its thread's end).
    assert answered_during_load >= 5
    big = index.owners["big"]
    assert big.size == 4000 and big.generation == big_state["big"][0]


@pytest.mark.django_db(transaction=True)
def test_concurrent_recalls_of_one_cold_owner_wait_for_one_load(settings):
    seed("cold", 5000, seed=5)
    index = VectorIndex(DIM)
    state = states("cold")
    results = []
    start = threading.Barrier(4)

    def recall():
        start.wait()
        results.append(index.sync(state))
        index.search(["cold"], np.ones(DIM, dtype=np.float32) / 8, 3)

    threads = [threading.Thread(target=recall) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [0, 0, 0, 5000]  # one thread read the owner; the others waited for it
    stats = index.stats()
    assert stats["loads"] == 1 and stats["misses"] == 1 and stats["hits"] == 3 and index.owners["cold"].size == 5000


@pytest.mark.django_db(transaction=True)
def test_healthz_reports_the_vector_cache(client, service, fake_embedder):
    body = client.get("/healthz").json()
    assert body["vectors"]["cache"] == {
        "bytes": 0,
        "cap_bytes": 256 * 1024 * 1024,
        "model_bytes": 0,  # a LangChain embedder: no bundled model runs in this process
        "owners": 0,
        "hits": 0,
        "misses": 0,
        "loads": 0,
        "evictions": 0,
    }
    service.set_fact("drink", "espresso", scope="global")
    service.recall("espresso", mode="vector")
    service.recall("espresso", mode="vector")
    cache = client.get("/healthz").json()["vectors"]["cache"]
    assert cache["owners"] >= 1 and cache["loads"] >= 1 and cache["misses"] >= 1 and cache["hits"] >= 1
    assert 0 < cache["bytes"] < cache["cap_bytes"] and cache["evictions"] == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("cap", ["256", -1, True])
def test_a_cap_that_is_not_megabytes_is_refused_by_name(settings, cap):
    from django.core.exceptions import ImproperlyConfigured

    seed("o1", 10)
    set_cap(settings, cap)
    with pytest.raises(ImproperlyConfigured, match="VECTOR_CACHE_MB"):
        VectorIndex(DIM).stats()
