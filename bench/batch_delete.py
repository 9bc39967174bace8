"""Batch delete benchmark: delete 10,000 and 100,000 facts through POST /api/v1/facts/batch-delete/.

    python -m bench.batch_delete [--database-url postgres://postgres@127.0.0.1:5432/postgres] [--json]

Each run fills a store (bulk insert, search index compacted, ANALYZE), then deletes facts chosen at
random through the real endpoint (URL routing, token auth, staff permission, JSON parsing, id
validation, MemoryService, one transaction per request) in requests of MEMORY["API_MAX_BATCH_IDS"]
(1,000) ids; only the requests are timed, counted together. Half of the first store and a tenth of
the second stay behind, so deletes run against an index that keeps other rows.
"""

import argparse
import json
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from .support.scratch import add_scratch_arguments, gather_statistics, scratch_django

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = [("delete_10k_s", 10_000, 20_000), ("delete_100k_s", 100_000, 110_000)]  # (name, deleted, filled)


def fill(n, rng, progress, label):
    from memory.models import Fact, MemoryUser, Scope
    from memory.text import fact_search_text

    users = MemoryUser.objects.bulk_create(
        [MemoryUser(canonical_id=f"bench:{label}:{i}", display_name=f"User {i}") for i in range(200)]
    )
    task = progress.add_task(f"filling {n:,} facts", total=n)
    batch, ids = [], []
    for i in range(n):
        roll = rng.random()
        scope = Scope.USER if roll < 0.5 else Scope.AGENT if roll < 0.8 else Scope.GLOBAL
        key = f"{label}_key_{i}"
        value = f"note {rng.randrange(10**6)} about {key}"
        batch.append(
            Fact(
                key=key,
                value=value,
                scope=scope,
                agent_id=f"agent{rng.randrange(50)}" if scope == Scope.AGENT else "",
                user_id=rng.choice(users).pk if scope == Scope.USER else None,
                confidence=round(rng.uniform(0.3, 1.0), 3),
                search_text=fact_search_text(key, value),
            )
        )
        if len(batch) == 5000 or i == n - 1:
            ids.extend(f.pk for f in Fact.objects.bulk_create(batch))
            progress.advance(task, len(batch))
            batch = []
    progress.remove_task(task)
    return ids


def prepare_store():
    from memory.service import MemoryService

    MemoryService().optimize_search_index()
    gather_statistics()


def staff_client():
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client
    from rest_framework.authtoken.models import Token

    if "testserver" not in settings.ALLOWED_HOSTS:
        settings.ALLOWED_HOSTS.append("testserver")
    staff, _ = get_user_model().objects.get_or_create(username="bench-operator", defaults={"is_staff": True})
    token, _ = Token.objects.get_or_create(user=staff)
    return Client(HTTP_AUTHORIZATION=f"Token {token.key}")


def delete_through_api(client, ids, progress, label):
    """POST the ids in requests of the API's limit; returns (seconds in requests, per-request seconds, curve)."""
    from memory.conf import memory_settings

    size = memory_settings.API_MAX_BATCH_IDS
    task = progress.add_task(f"deleting {label}", total=len(ids))
    per_request, curve, total, deleted = [], [(0, 0.0)], 0.0, 0
    for start in range(0, len(ids), size):
        chunk = ids[start : start + size]
        body = json.dumps({"ids": chunk})
        began = time.perf_counter()
        response = client.post("/api/v1/facts/batch-delete/", body, content_type="application/json")
        took = time.perf_counter() - began
        if response.status_code != 200:
            raise SystemExit(f"batch-delete answered {response.status_code}: {response.content[:300]!r}")
        answer = response.json()
        if answer["not_found"]:
            raise SystemExit(f"batch-delete did not find {len(answer['not_found'])} ids it should have")
        deleted += answer["deleted"]
        total += took
        per_request.append(took)
        curve.append((deleted, total))
        progress.advance(task, len(chunk))
    progress.remove_task(task)
    return total, per_request, curve


def run(seed, progress):
    from django.db import connection

    from memory.models import Fact

    rng = random.Random(seed)
    client = staff_client()
    results, curves, details = {}, {}, {}
    for name, deleted, filled in RUNS:
        ids = fill(filled, rng, progress, name)
        prepare_store()
        doomed = rng.sample(ids, deleted)
        left = Fact.objects.count() - deleted
        seconds, per_request, curve = delete_through_api(client, doomed, progress, f"{deleted:,} facts")
        if Fact.objects.filter(pk__in=doomed[:1000]).exists() or Fact.objects.count() != left:
            raise SystemExit("the store does not hold what the deletes reported")
        results[name] = seconds
        curves[name] = curve
        details[name] = {
            "requests": len(per_request),
            "median_request_ms": statistics.median(per_request) * 1000,
            "max_request_ms": max(per_request) * 1000,
            "store": filled,
            "left": left,
        }
        Fact.objects.all().delete()  # the next run starts from an empty store
    return results, curves, details, connection.vendor


def plot(curves, vendor):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    RESULTS.mkdir(exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, curve in curves.items():
        ax.plot([s for _, s in curve], [d for d, _ in curve], label=name.replace("_s", "").replace("_", " "))
    ax.set_xlabel("seconds in batch-delete requests")
    ax.set_ylabel("facts deleted")
    ax.set_title(f"POST /api/v1/facts/batch-delete/, 1,000 ids per request ({vendor})")
    ax.grid(True, alpha=0.3)
    ax.legend()
    path = RESULTS / f"batch_delete_{vendor}.png"
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.batch_delete", description=__doc__.splitlines()[0])
    add_scratch_arguments(parser, json_help='print exactly one JSON object {"delete_10k_s", "delete_100k_s"}')
    args = parser.parse_args(argv)
    err = Console(stderr=True)
    # WhiteNoise notes once that the scratch data folder has no collected static files; irrelevant here.
    warnings.filterwarnings("ignore", "No directory at", UserWarning)
    with scratch_django(args.database_url), Progress(console=err, transient=True) as progress:
        results, curves, details, vendor = run(args.seed, progress)
    png = plot(curves, vendor)
    if args.json:
        print(json.dumps({name: round(results[name], 3) for name, _, _ in RUNS}))
        return 0
    targets = {"delete_10k_s": 2.0, "delete_100k_s": 20.0}
    table = Table(title=f"Batch delete through the API ({vendor})")
    for column in ["run", "seconds", "target", "requests", "median request", "slowest request", "store → left"]:
        table.add_column(column, justify="left" if column == "run" else "right")
    for name, deleted, _ in RUNS:
        d = details[name]
        table.add_row(
            f"{deleted:,} facts",
            f"{results[name]:.2f}",
            f"≤ {targets[name]:.0f}",
            str(d["requests"]),
            f"{d['median_request_ms']:.0f} ms",
            f"{d['max_request_ms']:.0f} ms",
            f"{d['store']:,} → {d['left']:,}",
        )
    Console().print(table)
    err.print(f"plot: {png.relative_to(Path.cwd()) if png.is_relative_to(Path.cwd()) else png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
