"""Fact benchmark: fill N facts in a scratch database, then time gets, sets and searches through MemoryService.

    python -m bench.facts [--n 100000] [--seed 1] [--mode keyword|hybrid] [--fact-history on|off]
                          [--database-url postgres://...] [--json]

Workload (see bench/README.md): 40% agent facts over 100 agents, 40% user facts over 1,000 users,
10% session facts over 1,000 sessions, 10% global; keys from a pool of 2,000. Each owner holds a
key once, so global scope (more facts than pool keys) adds derived keys "key_<k>_<j>".
`--fact-history off` times the same workload with MEMORY["FACT_HISTORY"] = False (no version rows):
what fact history costs the sets.
"""

import argparse
import json
import os
import random
import sys
import time

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from .support.scratch import (
    add_mode_argument,
    add_scratch_arguments,
    gather_statistics,
    machine_reference,
    scratch_django,
)
from .support.servers import cpu_between, cpu_seconds

AGENTS, USERS, SESSIONS, POOL = 100, 1000, 1000, 2000
GETS, SETS, SEARCHES = 10_000, 2_000, 1_000
BROAD_SEARCHES = 200


class QueryCounter:
    """Counts statements on the connection (cheaper than capturing their text)."""

    def __init__(self):
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


def fill(n, rng, progress):
    from memory.models import Fact, MemoryUser, Scope
    from memory.text import fact_search_text

    users = MemoryUser.objects.bulk_create(
        [MemoryUser(canonical_id=f"bench:{i}", display_name=f"User {i}") for i in range(USERS)]
    )
    user_ids = [u.pk for u in users]
    plan = (
        [(Scope.AGENT, f"a{i}") for i in range(AGENTS) for _ in range(int(n * 0.4) // AGENTS)]
        + [(Scope.USER, user_ids[i]) for i in range(USERS) for _ in range(int(n * 0.4) // USERS)]
        + [(Scope.SESSION, f"s{i}") for i in range(SESSIONS) for _ in range(int(n * 0.1) // SESSIONS)]
    )
    plan += [(Scope.GLOBAL, None)] * (n - len(plan))
    used = {}
    task = progress.add_task("filling facts", total=n)
    batch = []
    for scope, owner in plan:
        taken = used.setdefault((scope, owner), set())
        if len(taken) < POOL:
            k = rng.randrange(POOL)
            while f"key_{k}" in taken:
                k = rng.randrange(POOL)
            key = f"key_{k}"
        else:  # global scope only: more facts than pool keys
            key = f"key_{rng.randrange(POOL)}_{len(taken)}"
        taken.add(key)
        value = f"note {rng.randrange(10**6)} about {key}"
        batch.append(
            Fact(
                key=key,
                value=value,
                scope=scope,
                agent_id=owner if scope == Scope.AGENT else "",
                user_id=owner if scope == Scope.USER else None,
                session_id=owner if scope == Scope.SESSION else "",
                confidence=round(rng.uniform(0.3, 1.0), 3),
                search_text=fact_search_text(key, value),
            )
        )
        if len(batch) == 5000:
            Fact.objects.bulk_create(batch)
            progress.advance(task, len(batch))
            batch = []
    if batch:
        Fact.objects.bulk_create(batch)
        progress.advance(task, len(batch))
    return user_ids


def fill_vectors(progress, seed):
    """Give every filled recall document a vector, as a store embedded over time would have.

    Random unit vectors of the model's dimension, written directly (embedding 100,000 texts with the
    local model would take minutes and time nothing the benchmark measures); the model is recorded
    as theirs, so the writes timed afterwards are embedded by the real model through the real path.
    """
    import numpy as np

    from memory.embedding.embedder import get_embedder, to_blob
    from memory.models import EmbeddingModelRecord, RecallDocument

    embedder = get_embedder()
    EmbeddingModelRecord.objects.all().delete()
    EmbeddingModelRecord.objects.create(model=embedder.model, dimension=embedder.dimension)
    ids = list(RecallDocument.objects.filter(embedding__isnull=True).values_list("id", flat=True))
    rng = np.random.default_rng(seed)
    task = progress.add_task("filling vectors", total=len(ids))
    for start in range(0, len(ids), 5000):
        chunk = ids[start : start + 5000]
        vectors = rng.standard_normal((len(chunk), embedder.dimension)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        RecallDocument.objects.bulk_update(
            [RecallDocument(id=i, embedding=to_blob(v)) for i, v in zip(chunk, vectors)], ["embedding"], batch_size=1000
        )
        progress.advance(task, len(chunk))
    progress.remove_task(task)


def timed(fn, calls, counter):
    before = counter.count
    start = time.perf_counter()
    for args in calls:
        fn(*args)
    elapsed = time.perf_counter() - start
    return elapsed, counter.count - before


def run(n, seed, progress, mode="keyword"):
    from django.db import connection

    from memory.models import Fact, Scope
    from memory.service import MemoryService

    rng = random.Random(seed)
    user_ids = fill(n, rng, progress)
    if mode == "hybrid":
        fill_vectors(progress, seed)
    # A bulk load ends as an import does: the search index compacted, and on PostgreSQL the
    # statistics autovacuum would have gathered by now (bench.support.scratch.gather_statistics).
    service = MemoryService()
    service.optimize_search_index()
    gather_statistics()
    service = MemoryService()
    counter = QueryCounter()
    results = {"n": Fact.objects.count()}
    with connection.execute_wrapper(counter):
        gets = [
            (
                f"key_{rng.randrange(POOL)}",
                f"a{rng.randrange(AGENTS)}",
                rng.choice(user_ids),
                f"s{rng.randrange(SESSIONS)}",
            )
            for _ in range(GETS)
        ]
        elapsed, queries = timed(
            lambda k, a, u, s: service.get_fact(k, agent_id=a, user_id=u, session_id=s), gets, counter
        )
        results["get_per_s"] = GETS / elapsed
        results["queries_per_get"] = queries / GETS
        flush_start = time.perf_counter()
        flushed = service.flush_access_counts()
        results["access_flush"] = {"facts": flushed, "ms": (time.perf_counter() - flush_start) * 1000}

        existing = list(
            Fact.objects.order_by("?").values_list("key", "scope", "agent_id", "user_id", "session_id")[: SETS // 2]
        )
        sets = []
        for key, scope, agent_id, user_id, session_id in existing:
            sets.append((key, f"changed {rng.randrange(3)}", scope, agent_id, user_id, session_id))
        for i in range(SETS - len(sets)):
            scope = rng.choice([Scope.AGENT, Scope.USER, Scope.SESSION, Scope.GLOBAL])
            sets.append(
                (
                    f"fresh_key_{i}",
                    f"fresh value {i}",
                    scope,
                    f"a{rng.randrange(AGENTS)}" if scope == Scope.AGENT else "",
                    rng.choice(user_ids) if scope == Scope.USER else None,
                    f"s{rng.randrange(SESSIONS)}" if scope == Scope.SESSION else "",
                )
            )
        rng.shuffle(sets)
        actions = {}

        def set_one(key, value, scope, agent_id, user_id, session_id):
            write = service.set_fact(key, value, scope=scope, agent_id=agent_id, user_id=user_id, session_id=session_id)
            actions[write.action] = actions.get(write.action, 0) + 1

        cpu_before, children_before = time.process_time(), cpu_seconds(os.getpid())
        elapsed, queries = timed(set_one, sets, counter)
        results["set_per_s"] = SETS / elapsed
        # CPU per set of this process (the sets and the embedding worker's thread) and of the model
        # processes it started: unlike the rate, these hardly move with what else the machine runs.
        _, model = cpu_between(children_before, cpu_seconds(os.getpid()))
        results["set_cpu_ms"] = (time.process_time() - cpu_before) * 1000 / SETS
        results["set_model_cpu_ms"] = model * 1000 / SETS
        results["set_actions"] = actions
        results["queries_per_set"] = queries / SETS
        if mode == "hybrid":  # how long the embedding worker took to catch up after the last set
            caught_up = time.perf_counter()
            service.wait_for_vectors()
            results["vectors_caught_up_ms"] = (time.perf_counter() - caught_up) * 1000
            results["pending_vectors"] = service.pending_vectors()

        agent, user = f"a{rng.randrange(AGENTS)}", rng.choice(user_ids)  # one agent and user asks them all
        searches = [(f"key {rng.randrange(POOL)}", agent, user) for _ in range(SEARCHES)]
        hits = []
        elapsed, queries = timed(
            lambda q, a, u: hits.append(len(service.search_facts(q, agent_id=a, user_id=u, limit=10))),
            searches,
            counter,
        )
        results["search_per_s"] = SEARCHES / elapsed
        results["queries_per_search"] = queries / SEARCHES
        results["mean_search_hits"] = sum(hits) / len(hits)
        # Not part of the workload above: words too short or too common for the trigram index alone.
        broad = [(f"key {rng.randrange(10, 100)}", agent, user) for _ in range(BROAD_SEARCHES)]
        elapsed, _ = timed(lambda q, a, u: service.search_facts(q, agent_id=a, user_id=u, limit=10), broad, counter)
        results["broad_search_per_s"] = BROAD_SEARCHES / elapsed
        service.flush_access_counts()
    results["database"] = connection.vendor
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.facts", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="facts to fill (default 100,000)")
    add_scratch_arguments(parser)
    add_mode_argument(parser)
    parser.add_argument(
        "--fact-history", choices=["on", "off"], default="on", help="keep fact versions (default on, as a user gets)"
    )
    args = parser.parse_args(argv)
    if args.n < 10_000:
        parser.error("--n must be at least 10,000 (the workload needs owners with facts)")
    err = Console(stderr=True)
    started = time.perf_counter()
    with scratch_django(args.database_url, mode=args.mode), Progress(console=err, transient=True) as progress:
        from django.conf import settings
        from django.test import override_settings

        with override_settings(MEMORY={**settings.MEMORY, "FACT_HISTORY": args.fact_history == "on"}):
            results = run(args.n, args.seed, progress, args.mode)
    total = time.perf_counter() - started
    results["mode"] = args.mode
    results["fact_history"] = args.fact_history
    if args.json:
        keys = ["n", "mode", "fact_history", "get_per_s", "set_per_s", "search_per_s", "queries_per_get"]
        keys += ["set_cpu_ms", "set_model_cpu_ms"]
        keys += ["vectors_caught_up_ms"] if args.mode == "hybrid" else []  # after the last set
        print(json.dumps({k: round(results[k], 3) if isinstance(results[k], float) else results[k] for k in keys}))
        return 0
    table = Table(
        title=f"MemoryService on {results['n']:,} facts ({results['database']}, {args.mode}, {total:.0f} s in all)"
    )
    table.add_column("operation")
    table.add_column("per second", justify="right")
    table.add_column("queries each", justify="right")
    table.add_column("notes")
    table.add_row(
        "get",
        f"{results['get_per_s']:,.0f}",
        f"{results['queries_per_get']:.3f}",
        f"{GETS:,} random (key, agent, user, session)",
    )
    table.add_row(
        "set",
        f"{results['set_per_s']:,.0f}",
        f"{results['queries_per_set']:.2f}",
        f"{SETS:,}, half to existing keys; {results['set_actions']}; CPU per set {results['set_cpu_ms']:.2f} ms here, "
        f"{results['set_model_cpu_ms']:.2f} ms in model processes",
    )
    table.add_row(
        "search",
        f"{results['search_per_s']:,.0f}",
        f"{results['queries_per_search']:.2f}",
        f"{SEARCHES:,} 'key <k>', random k, as one agent and user; {results['mean_search_hits']:.1f} hits each",
    )
    table.add_row(
        "broad search",
        f"{results['broad_search_per_s']:,.0f}",
        "",
        f"{BROAD_SEARCHES} 'key <k>' with k of two digits (no word the index narrows), same viewer",
    )
    if args.mode == "hybrid":
        table.add_row(
            "vectors",
            "",
            "",
            f"the embedding worker caught up {results['vectors_caught_up_ms']:,.0f} ms after the last set "
            f"({results['pending_vectors']} left pending)",
        )
    flush = results["access_flush"]
    table.add_row(
        "access flush", "", "", f"{flush['facts']:,} facts' counts written in {flush['ms']:.0f} ms after the gets"
    )
    Console().print(table)
    Console().print(machine_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
