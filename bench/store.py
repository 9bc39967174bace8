"""LangGraph stores side by side: EngramStore against InMemoryStore, SqliteStore and (optionally) PostgresStore.

    python -m bench.store [--items 10000] [--database-url postgres://postgres@127.0.0.1:5432/postgres] [--json]

One workload, one run, each store on its own fresh database: ITEMS puts over 100 namespaces, ITEMS
gets, 1,000 filtered searches, 1,000 query searches (where the store can answer them: EngramStore
with hybrid recall when the local model is installed, otherwise by words; LangGraph's stores only
with an `index` and its embeddings, which this workload does not give them), 1,000 list_namespaces.
Every call goes through the store's public API one operation at a time, as a graph's nodes call it.
With Engram's embedder (hybrid), puts commit without a vector and its embedding worker embeds them
in the background: the reads are timed once it has caught up, and how long that took is reported.

EngramStore and SqliteStore (the pair the ratios compare) are both open during the reads, which take
turns: each read operation's calls are cut into ROUNDS slices and the two stores run slice by slice,
alternately first, each store's time summed. On a machine whose load changes from minute to minute
the two rates then come from the same minutes, not from two phases minutes apart.
"""

import argparse
import json
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .support.scratch import add_scratch_arguments, machine_reference, scratch_django

NAMESPACES = 100
SEARCHES = 1_000
QUERIES = 1_000
LISTINGS = 1_000
ROUNDS = 10
WORDS = "tea coffee garden music travel books football cooking chess hiking painting cinema".split()


def workload(items, seed):
    rng = random.Random(seed)
    puts = []
    for n in range(items):
        ns = ("bench", f"ns{n % NAMESPACES}", "memories")
        words = rng.sample(WORDS, 3)
        puts.append((ns, f"k{n}", {"text": f"likes {' and '.join(words)}", "n": n, "tag": words[0]}))
    gets = [(p[0], p[1]) for p in rng.choices(puts, k=items)]
    searches = [(("bench", f"ns{rng.randrange(NAMESPACES)}"), {"tag": rng.choice(WORDS)}) for _ in range(SEARCHES)]
    queries = [(("bench", f"ns{rng.randrange(NAMESPACES)}"), f"who likes {rng.choice(WORDS)}?") for _ in range(QUERIES)]
    return puts, gets, searches, queries


def measure(store, work, *, queries_supported, caught_up=None):
    """One store's figures: its puts, then its reads."""
    out = timed_puts(store, work, caught_up)
    for op, seconds in timed_reads({"store": store}, work, {"store": queries_supported}, rounds=1)["store"].items():
        out[op] = seconds
    return out


def timed_puts(store, work, caught_up=None):
    puts = work[0]
    out = {}
    start = time.perf_counter()
    for ns, key, value in puts:
        store.put(ns, key, value)
    out["put_per_s"] = len(puts) / (time.perf_counter() - start)
    if caught_up is not None:  # EngramStore embeds after the commit: let its worker finish before the reads
        start = time.perf_counter()
        caught_up()
        out["vectors_caught_up_s"] = time.perf_counter() - start
    return out


def _slices(calls, rounds):
    size = -(-len(calls) // rounds)
    return [calls[i : i + size] for i in range(0, len(calls), size)]


def timed_reads(stores, work, queries_supported, *, rounds=ROUNDS):
    """{store name: {figure: value}} of the reads, the stores taking turns slice by slice (see the docstring)."""
    _, gets, searches, queries = work
    listings = [n % 80 for n in range(LISTINGS)]

    def get(store, calls):
        missing = sum(store.get(ns, key) is None for ns, key in calls)
        assert missing == 0, f"{missing} gets found nothing"
        return 0

    def search(store, calls):
        return sum(len(store.search(prefix, filter=f, limit=10)) for prefix, f in calls)

    def query(store, calls):
        for prefix, text in calls:
            store.search(prefix, query=text, limit=10)
        return 0

    def list_namespaces(store, calls):
        for offset in calls:
            store.list_namespaces(prefix=("bench",), max_depth=2, limit=20, offset=offset)
        return 0

    operations = [("get", get, gets), ("search", search, searches), ("query_search", query, queries)]
    operations.append(("list_namespaces", list_namespaces, listings))
    out = {name: {} for name in stores}
    for op, call, calls in operations:
        takers = [name for name in stores if op != "query_search" or queries_supported[name]]
        seconds, found = dict.fromkeys(takers, 0.0), dict.fromkeys(takers, 0)
        for turn, part in enumerate(_slices(calls, rounds)):
            for name in takers if turn % 2 == 0 else takers[::-1]:
                start = time.perf_counter()
                found[name] += call(stores[name], part)
                seconds[name] += time.perf_counter() - start
        for name in takers:
            out[name][f"{op}_per_s"] = len(calls) / seconds[name]
            if op == "search":
                out[name]["mean_search_hits"] = found[name] / len(calls)
    return out


def run(items, seed, database_url):
    from langgraph.store.memory import InMemoryStore
    from langgraph.store.sqlite import SqliteStore

    work = workload(items, seed)
    results = {"InMemoryStore": measure(InMemoryStore(), work, queries_supported=False)}
    if database_url:
        from langgraph.store.postgres import PostgresStore

        with PostgresStore.from_conn_string(database_url) as pg_store:
            pg_store.setup()
            for namespace in pg_store.list_namespaces(prefix=("bench",), limit=10_000):
                for item in pg_store.search(namespace, limit=10_000):
                    pg_store.delete(namespace, item.key)
            results["PostgresStore"] = measure(pg_store, work, queries_supported=False)
    with tempfile.TemporaryDirectory(prefix="engram-store-bench-") as tmp, scratch_django(database_url):
        from django.db import connection

        from memory.embedding.embedder import configured_mode
        from memory.service import MemoryService
        from workflows.store import EngramStore

        conn = sqlite3.connect(str(Path(tmp) / "store.sqlite3"), check_same_thread=False, isolation_level=None)
        try:
            sqlite_store = SqliteStore(conn)
            sqlite_store.setup()
            engram_store = EngramStore()
            results["SqliteStore"] = timed_puts(sqlite_store, work)
            results["EngramStore"] = timed_puts(engram_store, work, caught_up=MemoryService().wait_for_vectors)
            reads = timed_reads(
                {"SqliteStore": sqlite_store, "EngramStore": engram_store},
                work,
                {"SqliteStore": False, "EngramStore": True},
            )
        finally:
            conn.close()
        for name, figures in reads.items():
            results[name].update(figures)
        results["EngramStore"]["query_mode"] = "hybrid" if configured_mode() == "hybrid" else "keyword"
        results["EngramStore"]["database"] = connection.vendor
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.store", description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000, help="puts and gets (default 10,000)")
    add_scratch_arguments(parser)
    args = parser.parse_args(argv)
    results = run(args.items, args.seed, args.database_url)
    engram, sqlite_ = results["EngramStore"], results["SqliteStore"]
    ratios = {
        f"engram_vs_sqlite_{op}": engram[f"{op}_per_s"] / sqlite_[f"{op}_per_s"]
        for op in ("put", "get", "search", "list_namespaces")
    }
    if args.json:
        rounded = {s: {k: round(v, 1) if isinstance(v, float) else v for k, v in r.items()} for s, r in results.items()}
        print(json.dumps({"items": args.items, **rounded, **{k: round(v, 2) for k, v in ratios.items()}}))
        return 0
    table = Table(title=f"LangGraph stores, {args.items:,} items over {NAMESPACES} namespaces (operations per second)")
    for column in ("store", "put", "get", "filtered search", "query search", "list_namespaces"):
        table.add_column(column, justify="left" if column == "store" else "right")
    for name, r in results.items():
        query = f"{r['query_search_per_s']:,.0f} ({r['query_mode']})" if "query_search_per_s" in r else "no index"
        table.add_row(
            name,
            f"{r['put_per_s']:,.0f}",
            f"{r['get_per_s']:,.0f}",
            f"{r['search_per_s']:,.0f}",
            query,
            f"{r['list_namespaces_per_s']:,.0f}",
        )
    console = Console()
    console.print(table)
    console.print(", ".join(f"{k.replace('_', ' ')}: {v:.2f}x" for k, v in ratios.items()))
    if engram["query_mode"] == "hybrid":
        console.print(
            f"EngramStore's embedding worker caught up {engram['vectors_caught_up_s']:.1f} s after the last put "
            "(the reads were timed after it)"
        )
    console.print(machine_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
