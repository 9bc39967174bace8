"""Vector memory per process: RSS with and without MEMORY["VECTOR_CACHE_MB"], a cold owner's load, recalls meanwhile.

```
python -m bench.vector_memory [--facts 100000] [--owners 1000] [--big 50000] [--cap-mb 64] [--dimension 384]
                              [--database-url URL] [--json]
```

Seeds a scratch database with `--facts` documents of random unit vectors spread evenly over `--owners`
user owners, plus one owner of `--big` documents, straight into the recall index (as embedding workers
store them: the model would take hours for these sizes, and the index reads nothing else). Then:

- **RSS**: a fresh process per setting (no cap, then `--cap-mb`) loads every small owner into its
  vector index, as a worker whose recalls touched them all would, and reports its resident memory
  before and after, with the index's own count of bytes held.
- **Cold load**: in this process, with one small owner loaded, a thread loads the big owner while the
  main thread recalls the small one (sync, then a search for a random vector) as fast as it can: the
  big owner's load time, and the small owner's recall latency (p50/p95) during that load and idle.

Prints a table, or with `--json` one JSON object.
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from .support.scratch import REPO, machine_reference, scratch_django

_SEED_BATCH = 2000


def rss_bytes():
    """This process's resident set size, from /proc (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def unit_vectors(rng, n, dimension):
    vectors = rng.standard_normal((n, dimension)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def seed(owner_sizes, dimension, rng, console):
    """Documents with vectors for {owner: count}, in bulk; their owners' generations move by trigger."""
    from memory.models import RecallDocument

    item = 0
    for owner, count in owner_sizes.items():
        for start in range(0, count, _SEED_BATCH):
            n = min(_SEED_BATCH, count - start)
            vectors = unit_vectors(rng, n, dimension)
            RecallDocument.objects.bulk_create(
                [
                    RecallDocument(kind="fact", item_id=item + i, owner=owner, text="", embedding=vectors[i].tobytes())
                    for i in range(n)
                ]
            )
            item += n
    console.print(f"seeded {item:,} vectors over {len(owner_sizes):,} owners")


def states(owners=None):
    from memory.models import RecallScope

    rows = RecallScope.objects.all()
    if owners is not None:
        rows = rows.filter(owner__in=owners)
    return {o: (g, r) for o, g, r in rows.values_list("owner", "generation", "removed")}


def child(args):
    """One process holding the small owners' vectors under a cap (or none): prints its figures as JSON."""
    sys.path.insert(0, str(REPO / "platform"))
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    import django

    django.setup()
    from django.conf import settings
    from django.db import connections

    from memory.conf import memory_settings
    from memory.recall.vectors import get_vector_index

    cap = None if args.child_cap < 0 else args.child_cap
    settings.MEMORY = {**getattr(settings, "MEMORY", {}), "VECTOR_CACHE_MB": cap}
    memory_settings.reload()
    owners = sorted(o for o in states() if o.startswith("user:"))
    index = get_vector_index(args.dimension)
    before = rss_bytes()
    started = time.perf_counter()
    for i in range(0, len(owners), 4):  # a recall's worth of owners at a time (user, agent, global, session)
        index.sync(states(owners[i : i + 4]))
    seconds = time.perf_counter() - started
    stats = index.stats()
    vectors = sum(m.size for m in index.owners.values())
    after = rss_bytes()
    # SQLite's page cache (PRAGMA cache_size, 64 MiB per connection) grew with the pages read: it is
    # the connection's, not the index's, and goes with it.
    connections.close_all()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # give back what the allocator keeps of freed memory
    print(
        json.dumps(
            {
                "rss_before_mb": round(before / 2**20, 1),
                "rss_after_mb": round(after / 2**20, 1),
                "rss_after_closing_and_trim_mb": round(rss_bytes() / 2**20, 1),
                "index_mb": round(stats["bytes"] / 2**20, 1),
                "vectors_held": vectors,
                "owners_held": stats["owners"],
                "evictions": stats["evictions"],
                "load_s": round(seconds, 2),
            }
        )
    )


def rss_run(cap, args):
    command = [sys.executable, "-m", "bench.vector_memory", "--child-cap", str(-1 if cap is None else cap)]
    command += ["--dimension", str(args.dimension)]
    out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))] if values else None


def cold_load(args, rng):
    """The big owner's load in a thread; the small owner's recall latencies meanwhile and idle (ms)."""
    from django.db import connection

    from memory.recall.vectors import VectorIndex

    index = VectorIndex(args.dimension)
    small = {"user:0": states(["user:0"])["user:0"]}
    big = states(["big"])
    index.sync(small)

    def recall():
        t0 = time.perf_counter()
        index.sync(small)
        index.search(["user:0"], unit_vectors(rng, 1, args.dimension)[0], 10)
        return (time.perf_counter() - t0) * 1000.0

    alone = VectorIndex(args.dimension)
    t0 = time.perf_counter()
    alone.sync(big)
    alone_s = time.perf_counter() - t0
    del alone
    idle = [recall() for _ in range(200)]
    load = {}

    def load_big():
        t0 = time.perf_counter()
        index.sync(big)
        load["s"] = time.perf_counter() - t0
        connection.close()

    thread = threading.Thread(target=load_big)
    thread.start()
    during = []
    while thread.is_alive():
        during.append(recall())
        time.sleep(0.002)  # requests come and go; a loop without pauses would only measure the interpreter's lock
    thread.join()
    return {
        "big_owner_vectors": index.owners["big"].size,
        "cold_load_s": round(alone_s, 2),
        "cold_load_s_during_recalls": round(load["s"], 2),
        "small_recalls_during_load": len(during),
        "small_p50_ms_during_load": round(percentile(during, 50), 2),
        "small_p95_ms_during_load": round(percentile(during, 95), 2),
        "small_p95_ms_idle": round(percentile(idle, 95), 2),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", type=int, default=100_000)
    parser.add_argument("--owners", type=int, default=1000)
    parser.add_argument("--big", type=int, default=50_000)
    parser.add_argument("--cap-mb", type=float, default=64)
    parser.add_argument("--dimension", type=int, default=384)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--database-url", help="a PostgreSQL server (postgres://user@host:port/any); default SQLite")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child-cap", type=float, help=argparse.SUPPRESS)  # the RSS runs' own processes
    args = parser.parse_args(argv)
    if args.child_cap is not None:
        child(args)
        return 0
    console = Console(stderr=True)
    rng = np.random.default_rng(args.seed)
    with scratch_django(args.database_url, mode="keyword"):
        per_owner = args.facts // args.owners
        seed({f"user:{i}": per_owner for i in range(args.owners)} | {"big": args.big}, args.dimension, rng, console)
        from django.db import connections

        connections.close_all()
        uncapped = rss_run(None, args)
        console.print(f"no cap: {uncapped}")
        capped = rss_run(args.cap_mb, args)
        console.print(f"cap {args.cap_mb} MB: {capped}")
        cold = cold_load(args, rng)
        console.print(f"cold load: {cold}")
    held = uncapped["vectors_held"]
    per_vector = (uncapped["rss_after_closing_and_trim_mb"] - uncapped["rss_before_mb"]) * 2**20 / held
    figures = {
        "facts": per_owner * args.owners,
        "dimension": args.dimension,
        "database": "postgresql" if args.database_url else "sqlite",
        "no_cap": uncapped,
        "cap_mb": args.cap_mb,
        "capped": capped,
        "rss_bytes_per_vector": round(per_vector),
        "index_bytes_per_vector": round(uncapped["index_mb"] * 2**20 / held),
        # Without a cap a process that touches every owner holds every vector: this many GB for 10M.
        "no_cap_10m_facts_gb": round(uncapped["rss_before_mb"] / 1024 + 10_000_000 * per_vector / 2**30, 1),
        **cold,
        "machine_reference_s": machine_reference(),
    }
    if args.json:
        print(json.dumps(figures))
        return 0
    table = Table(
        title=f"vector memory, {figures['facts']:,} facts over {args.owners:,} owners, {args.dimension} dimensions"
    )
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in figures.items():
        table.add_row(key, json.dumps(value) if isinstance(value, dict) else str(value))
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
