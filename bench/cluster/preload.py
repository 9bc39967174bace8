"""A store that already holds many facts when the cluster starts (python -m bench.cluster --preload-facts N),
and trials that make every process hold their vectors, for the memory figures.

- `preload`: --preload-facts user facts spread evenly over --preload-owners people, with their vectors,
  written in bulk before the servers start (untimed). The vectors are the local model's, of a pool
  of --vector-pool distinct texts, each fact given the vector of one of them in turn: embedding 100,000
  texts on a small shared machine takes about 20 minutes (1,000 took 12.8 s there), and what a
  process holds for a vector (its bytes, its place in the owner's matrix) does not depend on its
  values. A fact's text names its pool text, so recall's keyword leg and its vector agree.
- `touch`: then every worker links every preloaded document to its similar ones (memory.link_similar,
  what the worker that embedded them ran next), each through its own queue, so each worker loads every
  owner's vectors as far as its cap lets it; and each server answers a recall (vector mode) for every
  preloaded person, so each server loads them too.
- `caches`: each process's vector cache figures, from /healthz for a server and from the
  `vector_cache` remote-control command (memory/tasks.py) for a worker.
"""

import time
from concurrent.futures import ThreadPoolExecutor

_BATCH = 5000
_LINK_CHUNK = 2000  # document ids per link task: one worker's batch of a drain is at most a few hundred

TOPICS = (
    "the garden",
    "a bicycle",
    "the dentist",
    "a trip to Lisbon",
    "the kitchen tap",
    "a birthday",
    "the tax return",
    "a piano lesson",
    "the cat's food",
    "a football match",
)


def pool_text(n):
    """Distinct texts of a few words, as facts' values are."""
    return f"note {n}: about {TOPICS[n % len(TOPICS)]}, item {n * 7919 % 100_003} of list {n // len(TOPICS)}"


def preload(n, owners, pool_size, say=print):
    """`n` user facts over `owners` people (key `preload_<j>`), each with the model's vector of one of
    `pool_size` texts; returns what was written and how long each part took."""
    import numpy as np

    from memory.embedding.embedder import model_identity, to_blob
    from memory.models import EmbeddingModelRecord, Fact, MemoryUser, RecallDocument, Scope
    from memory.text import fact_search_text

    from .trials import CountingEmbeddings

    started = time.perf_counter()
    # The cluster's own embedder class, so the model recorded is the one its processes check against;
    # in this process (process=False: no model children), and not counted as the cluster's model calls.
    counting = CountingEmbeddings(process=False)
    texts = [pool_text(k) for k in range(pool_size)]
    embed_started = time.perf_counter()
    vectors = np.asarray(counting.inner.embed_documents(texts), dtype=np.float32)
    embed_seconds = time.perf_counter() - embed_started
    EmbeddingModelRecord.objects.all().delete()
    EmbeddingModelRecord.objects.create(model=model_identity(counting), dimension=vectors.shape[1])
    say(f"preload: {pool_size:,} pool texts embedded in {embed_seconds:.1f} s")

    users = MemoryUser.objects.bulk_create(
        [MemoryUser(canonical_id=f"preload:{i}", display_name=f"Preloaded {i}") for i in range(owners)]
    )
    batch, per_owner = [], -(-n // owners)
    for k in range(n):
        # Owner by owner in turn; an owner's facts take consecutive pool texts, so they differ.
        user, j = users[k % owners], k // owners
        value = pool_text(((k % owners) * per_owner + j) % pool_size)
        key = f"preload_{j}"
        batch.append(
            Fact(
                key=key,
                value=value,
                scope=Scope.USER,
                user_id=user.pk,
                confidence=0.8,
                search_text=fact_search_text(key, value),
            )
        )
        if len(batch) == _BATCH:
            Fact.objects.bulk_create(batch)
            batch = []
    if batch:
        Fact.objects.bulk_create(batch)
    facts_seconds = time.perf_counter() - started - embed_seconds
    say(f"preload: {n:,} facts written in {facts_seconds:.1f} s")

    # The facts' recall documents (written by the database's triggers), given their vectors in order.
    fact_of = dict(Fact.objects.filter(key__startswith="preload_").values_list("id", "value").iterator())
    docs = [
        (doc_id, item_id)
        for doc_id, item_id in RecallDocument.objects.filter(kind="fact").values_list("id", "item_id").iterator()
        if item_id in fact_of
    ]
    by_text = {text: k for k, text in enumerate(texts)}
    for start in range(0, len(docs), _BATCH):
        RecallDocument.objects.bulk_update(
            [
                RecallDocument(id=doc_id, embedding=to_blob(vectors[by_text[fact_of[item_id]]]))
                for doc_id, item_id in docs[start : start + _BATCH]
            ],
            ["embedding"],
            batch_size=1000,
        )
    say(f"preload: {len(docs):,} vectors stored")
    return {
        "facts": n,
        "owners": owners,
        "vector_pool": pool_size,
        "documents_with_a_vector": len(docs),
        "pool_embed_s": round(embed_seconds, 1),
        "write_s": round(time.perf_counter() - started - embed_seconds, 1),
        "user_ids": [u.pk for u in users],
    }


def _queued(app, queue):
    with app.connection_for_write() as connection:
        try:
            return connection.default_channel.queue_declare(queue, passive=True).message_count
        except connection.channel_errors:  # Redis keeps no empty queue: none declared is none waiting
            return 0


def worker_caches(app, timeout=10.0):
    """{worker name: its vector cache figures}, from each worker that answers in time."""
    replies = app.control.broadcast("vector_cache", reply=True, timeout=timeout)
    return {name: stats for reply in replies or [] for name, stats in reply.items()}


def touch(cluster, preloaded, recall_threads=4, timeout=1800.0, say=print):
    """Every worker links every preloaded document (through its own queue); every server answers a
    vector recall for every preloaded person. Returns how long each took and what was sent."""
    import httpx
    from config.celery import app
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from memory.models import RecallDocument

    started = time.perf_counter()
    ids = list(
        RecallDocument.objects.filter(kind="fact", owner__startswith="user:")
        .exclude(embedding=None)
        .order_by("owner", "id")
        .values_list("id", flat=True)
    )
    chunks = [ids[s : s + _LINK_CHUNK] for s in range(0, len(ids), _LINK_CHUNK)]
    for queue in cluster.own_queues:
        for chunk in chunks:
            app.send_task("memory.link_similar", args=[chunk], queue=queue, ignore_result=True)

    staff, _ = get_user_model().objects.get_or_create(username="cluster-bench", defaults={"is_staff": True})
    token, _ = Token.objects.get_or_create(user=staff)
    headers = {"Authorization": f"Token {token.key}"}
    recall_errors = []

    def recall(item):
        server, person = item
        with httpx.Client(timeout=120) as client:
            params = {"q": "a note about the garden", "mode": "vector", "user": person, "limit": 5}
            found = client.get(f"{cluster.url(server)}/api/v1/recall/", params=params, headers=headers)
        if found.status_code != 200:
            recall_errors.append(found.status_code)

    plan = [(server, person) for person in preloaded["user_ids"] for server in cluster.servers]
    with ThreadPoolExecutor(max_workers=recall_threads) as pool:
        list(pool.map(recall, plan))
    recalls_seconds = time.perf_counter() - started
    say(f"touch: {len(plan):,} recalls in {recalls_seconds:.0f} s; waiting for the workers' links")

    # Done when each worker's queue is empty and its cache figures stop moving (a solo worker answers
    # the remote control between tasks, so an answer means it finished the task before).
    last, steady = None, 0
    while time.perf_counter() - started < timeout:
        waiting = sum(_queued(app, queue) for queue in cluster.own_queues)
        caches = worker_caches(app)
        if waiting == 0 and caches == last:
            steady += 1
            if steady >= 2:
                break
        else:
            steady = 0
        last = caches
        time.sleep(5)
    return {
        "documents_linked_by_each_worker": len(ids),
        "link_tasks_per_worker": len(chunks),
        "recalls": len(plan),
        "recall_errors": len(recall_errors),
        "recalls_s": round(recalls_seconds, 1),
        "s": round(time.perf_counter() - started, 1),
    }


def server_cache(url):
    """The server's vector cache figures from its /healthz (which also computes the store's health:
    minutes with 100,000 facts on a loaded machine), or what went wrong."""
    import httpx

    try:
        return httpx.get(f"{url}/healthz", timeout=600).json()["vectors"]["cache"]
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
