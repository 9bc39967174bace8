"""The workload bench.instructions counts, run under callgrind in a checkout given by --tree.

    valgrind --tool=callgrind --separate-threads=yes --instr-atstart=no ... \
        python bench/support/callgrind_workload.py --tree CHECKOUT --group facts --mode keyword --out FILE

Not a benchmark of its own: bench.instructions starts it, once per group and mode, with CHECKOUT (this
one or an older commit's temporary worktree) first on the module path, so the code measured and the
workload's helpers (bench.facts.fill, bench.store.workload, ...) are that checkout's. It imports
nothing from the checkout it is stored in; where a module moved between commits, both paths are
tried. Each operation runs once outside the count (caches, compiled statements), then CALLS times
with callgrind's instrumentation on, and the counters are dumped under the operation's name;
FILE gets {operation: [dump number, calls]} for bench.instructions to read the dumps by. A dump of an
empty run ("calibration") holds what switching the count on and off costs.
"""

import argparse
import json
import os
import random
import subprocess
import sys


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", required=True)
    parser.add_argument("--group", choices=["facts", "store", "recall", "webhook"], required=True)
    parser.add_argument("--mode", choices=["keyword", "hybrid"], required=True)
    parser.add_argument("--n", type=int, default=10_000, help="facts filled (facts), items (store), documents (recall)")
    parser.add_argument("--calls", type=int, default=200, help="counted calls of each operation")
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def first(*paths):
    """The first of "module:name" paths that imports (modules moved between the compared commits)."""
    import importlib

    for path in paths:
        module, _, name = path.partition(":")
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        return getattr(found, name) if name else found
    raise ImportError(f"none of {paths} imports")


CLIENT = r"""
#include <valgrind/callgrind.h>
void engram_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void engram_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
void engram_dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
"""


class Counter:
    """Switches callgrind's instrumentation on around a run of calls and dumps the counters by name.

    Through valgrind's client requests (a few lines of C built here against valgrind's header):
    they take effect at once, on the calling thread, where callgrind_control asks the valgrind
    process from outside and, on a loaded machine, can return before a dump was written.
    """

    def __init__(self, folder):
        import ctypes

        source, library = os.path.join(folder, "client.c"), os.path.join(folder, "client.so")
        with open(source, "w") as out:
            out.write(CLIENT)
        subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", library, source], check=True)
        self.client = ctypes.CDLL(library)
        self.dumps = {}

    def count(self, name, calls, fn):
        self.client.engram_start()
        for call in calls:
            fn(*call)
        self.client.engram_stop()
        self.client.engram_dump(name.encode())
        self.dumps[name] = [len(self.dumps) + 1, len(calls)]

    def measure(self, name, calls, fn):
        fn(*calls[0])  # outside the count: first-call caches
        self.count(name, calls[1:], fn)


def facts(args, counter):
    from rich.progress import Progress

    bench_facts = first("bench.facts")
    from memory.models import Fact, Scope
    from memory.service import MemoryService

    rng = random.Random(1)
    with Progress(transient=True) as progress:
        user_ids = bench_facts.fill(args.n, rng, progress)
        if args.mode == "hybrid":
            bench_facts.fill_vectors(progress, 1)
    MemoryService().optimize_search_index()
    service = MemoryService()
    pool, agents, sessions = bench_facts.POOL, bench_facts.AGENTS, bench_facts.SESSIONS
    gets = [
        (f"key_{rng.randrange(pool)}", f"a{rng.randrange(agents)}", rng.choice(user_ids), f"s{rng.randrange(sessions)}")
        for _ in range(args.calls + 1)
    ]
    existing = Fact.objects.order_by("id").values_list("key", "scope", "agent_id", "user_id", "session_id")
    sets = [(k, f"changed {rng.randrange(3)}", s, a, u, se) for k, s, a, u, se in existing[: (args.calls + 1) // 2]]
    for i in range(args.calls + 1 - len(sets)):
        scope = rng.choice([Scope.AGENT, Scope.USER, Scope.SESSION, Scope.GLOBAL])
        sets.append(
            (
                f"fresh_key_{i}",
                f"fresh value {i}",
                scope,
                f"a{rng.randrange(agents)}" if scope == Scope.AGENT else "",
                rng.choice(user_ids) if scope == Scope.USER else None,
                f"s{rng.randrange(sessions)}" if scope == Scope.SESSION else "",
            )
        )
    rng.shuffle(sets)
    agent, user = f"a{rng.randrange(agents)}", rng.choice(user_ids)
    searches = [(f"key {rng.randrange(pool)}", agent, user) for _ in range(args.calls + 1)]
    counter.measure("get_fact", gets, lambda k, a, u, s: service.get_fact(k, agent_id=a, user_id=u, session_id=s))
    counter.measure(
        "set_fact",
        sets,
        lambda k, v, s, a, u, se: service.set_fact(k, v, scope=s, agent_id=a, user_id=u, session_id=se),
    )
    if args.mode == "hybrid":
        service.wait_for_vectors()
    counter.measure("search_facts", searches, lambda q, a, u: service.search_facts(q, agent_id=a, user_id=u, limit=10))
    service.flush_access_counts()


def store(args, counter):
    bench_store = first("bench.store")
    from memory.service import MemoryService
    from workflows.store import EngramStore

    puts, gets, searches, queries = bench_store.workload(args.n, 1)
    engram = EngramStore()
    for ns, key, value in puts[: -args.calls - 1]:  # filled outside the count, as the earlier puts of the bench
        engram.put(ns, key, value)
    if args.mode == "hybrid":
        # Random vectors for the fill, as bench.facts gives its filled facts: the model embedding
        # 10,000 items under valgrind would take hours and is not what is counted.
        from rich.progress import Progress

        with Progress(transient=True) as progress:
            first("bench.facts").fill_vectors(progress, 1)
    counter.measure("store.put", puts[-args.calls - 1 :], engram.put)
    MemoryService().wait_for_vectors()
    counter.measure("store.get", gets[: args.calls + 1], engram.get)
    counter.measure(
        "store.search (filter)", searches[: args.calls + 1], lambda p, f: engram.search(p, filter=f, limit=10)
    )
    counter.measure("store.search (query)", queries[: args.calls + 1], lambda p, q: engram.search(p, query=q, limit=10))
    counter.measure(
        "store.list_namespaces",
        [(n % 80,) for n in range(args.calls + 1)],
        lambda offset: engram.list_namespaces(prefix=("bench",), max_depth=2, limit=20, offset=offset),
    )


def recall(args, counter):
    import numpy as np
    from rich.progress import Progress

    bench_recall = first("bench.recall_latency")
    from memory.service import MemoryService

    rng = np.random.default_rng(1)
    vocab, probs = bench_recall._words(rng)
    content = probs.copy()
    content[:100] = 0
    content /= content.sum()
    queries = [
        (" ".join(vocab[j] for j in rng.choice(len(vocab), size=int(rng.integers(2, 5)), p=content)),)
        for _ in range(args.calls + 1)
    ]
    if args.mode == "hybrid":
        from memory.models import EmbeddingModelRecord

        embedder = first("memory.embedding.embedder:get_embedder", "memory.embeddings:get_embedder")()
        EmbeddingModelRecord.objects.create(model=embedder.model, dimension=embedder.dimension)
    with Progress(transient=True) as progress:
        bench_recall.grow(0, args.n, rng, vocab, probs, progress)
    service = MemoryService()
    service.optimize_recall_index()
    agent = bench_recall.AGENT
    for (query,) in queries:  # the query embeddings are cached: the model's work is not what is compared
        service.recall(query, agent_id=agent, mode=args.mode)
    counter.measure(f"recall ({args.mode})", queries, lambda q: service.recall(q, agent_id=agent, mode=args.mode))
    try:
        in_workspace = first("memory.models:in_workspace")
    except (ImportError, AttributeError):  # a commit from before workspaces
        in_workspace = None
    if in_workspace is not None:

        def in_the_default_workspace(query):  # as a request of a workspace member recalls
            with in_workspace(1):
                service.recall(query, agent_id=agent, mode=args.mode)

        counter.measure(f"recall in a workspace ({args.mode})", queries, in_the_default_workspace)
    service.flush_recall_log()


def webhook(args, counter):
    from django.test import Client

    servers = first("bench.support.servers", "bench.webhook")
    update = first("workflows.channels.fake_telegram:telegram_update", "workflows.fake_telegram:telegram_update")
    from workflows.demo import ensure_demo_workflow

    workflow, _ = ensure_demo_workflow()
    url = f"/telegram/{workflow.slug}/webhook/"
    client = Client(HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN=servers.SECRET)

    def send(payload):
        body = client.post(url, data=payload, content_type="application/json").json()
        assert body.get("status") == "ran" and body.get("reply_sent"), body

    users, first_pass = 10, 20
    plan = [update(n + 1, 1000 + n % users, servers.text_for(n, n % users)) for n in range(first_pass + args.calls)]
    for payload in plan[:first_pass]:  # every user exists and has a few memories before the count
        send(payload)
    if args.mode == "hybrid":
        from memory.service import MemoryService

        MemoryService().wait_for_vectors()
    counter.count("webhook update", [(p,) for p in plan[first_pass:]], send)


def main(argv=None):
    args = parse(argv)
    tree = os.path.abspath(args.tree)
    # This file's folder is not a package root: the checkout measured comes first instead.
    sys.path[0:1] = [tree]
    os.chdir(tree)
    scratch_django = first("bench.support.scratch:scratch_django", "bench.scratch:scratch_django")
    counter = Counter(os.path.dirname(os.path.abspath(args.out)))
    counter.count("calibration", [()] * 1, lambda: None)
    if args.group == "webhook":
        fake_bot = first("workflows.channels.fake_telegram:FakeBotAPI", "workflows.fake_telegram:FakeBotAPI")
        servers = first("bench.support.servers", "bench.webhook")
        bot = fake_bot()
        bot.__enter__()
        os.environ.update(
            TELEGRAM_API_BASE=bot.url, TELEGRAM_BOT_TOKEN=servers.TOKEN, TELEGRAM_WEBHOOK_SECRET=servers.SECRET
        )
        os.environ.pop("ENGRAM_CHAT_MODEL", None)
    with scratch_django(None, mode=args.mode):
        {"facts": facts, "store": store, "recall": recall, "webhook": webhook}[args.group](args, counter)
    with open(args.out, "w") as out:
        json.dump(counter.dumps, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
