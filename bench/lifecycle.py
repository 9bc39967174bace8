"""Lifecycle benchmark: export N memories, clear them, import them back and compare every row.

    python -m bench.lifecycle [--n 100000] [--seed 1] [--database-url postgres://postgres@127.0.0.1:5432/postgres] [--json]

Fills a scratch database (see bench/support/scratch.py) with N rows across every exported kind: 1% users
(each with one or two channel identities), 20% episodes (a short conversation each), 0.5%
procedures, and facts for the rest (user, agent, session and global scopes, JSON values of several
shapes, a quarter of them linked to an episode). Then, through MemoryService: export to a JSON Lines
file, clear everything, import the file, and compare a digest of every column of every row (ids,
timestamps, relations, the derived owner and search columns) with the one taken before.
"""

import argparse
import hashlib
import json
import random
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .support.scratch import add_scratch_arguments, scratch_django

AGENTS, SESSIONS = 50, 2000


def plan(n):
    users = max(1, n // 100)
    episodes = n // 5
    procedures = max(1, n // 200)
    identities = users + users // 2
    facts = n - users - identities - episodes - procedures
    return {"user": users, "identity": identities, "episode": episodes, "procedure": procedures, "fact": facts}


def fill(n, rng, progress):
    from django.utils import timezone

    from memory.models import ChannelIdentity, Episode, Fact, MemoryUser, Procedure, Scope
    from memory.text import fact_search_text

    counts = plan(n)
    task = progress.add_task("filling", total=n)
    now = timezone.now()
    users = MemoryUser.objects.bulk_create(
        [
            MemoryUser(
                canonical_id=f"bench:{i}",
                display_name=f"User {i}",
                total_conversations=i % 7,
                last_seen=now - timedelta(minutes=i),
            )
            for i in range(counts["user"])
        ]
    )
    user_ids = [u.pk for u in users]
    progress.advance(task, len(users))
    identities = [ChannelIdentity(user_id=uid, channel="bench", external_id=str(uid)) for uid in user_ids]
    identities += [
        ChannelIdentity(user_id=user_ids[i], channel="email", external_id=f"user{i}@example.org")
        for i in range(counts["identity"] - len(identities))
    ]
    ChannelIdentity.objects.bulk_create(identities, batch_size=2000)
    progress.advance(task, len(identities))
    episode_ids = []
    for start in range(0, counts["episode"], 2000):
        batch = [
            Episode(
                agent_id=f"agent-{rng.randrange(AGENTS)}",
                user_id=rng.choice(user_ids),
                session_id=f"s{rng.randrange(SESSIONS)}",
                workflow="bench",
                trigger_type="telegram",
                trigger_input={"text": f"question {i}"},
                conversation=[
                    {"role": "user", "content": f"question {i}"},
                    {"role": "assistant", "content": f"answer {i}"},
                ],
                actions=[{"tool": "recall", "hits": i % 5}],
                final_output={"reply": f"answer {i}"},
                success=i % 9 != 0,
                ended_at=now - timedelta(seconds=i),
                duration_ms=i % 5000,
                summary=f"answered question {i}",
                processed_for_facts=i % 2 == 0,
            )
            for i in range(start, min(start + 2000, counts["episode"]))
        ]
        episode_ids += [e.pk for e in Episode.objects.bulk_create(batch)]
        progress.advance(task, len(batch))
    Procedure.objects.bulk_create(
        [
            Procedure(
                agent_id=f"agent-{i % AGENTS}" if i % 3 else "",
                name=f"procedure {i}",
                trigger_conditions={"goal_contains": [f"topic{i}"]},
                content={"prompt": f"step {i}"},
                times_used=i % 11,
                times_succeeded=(i % 11) // 2,
                success_rate=((i % 11) // 2) / max(1, i % 11),
            )
            for i in range(counts["procedure"])
        ]
    )
    progress.advance(task, counts["procedure"])
    owners = (
        [(Scope.USER, uid) for uid in user_ids]
        + [(Scope.AGENT, f"agent-{i}") for i in range(AGENTS)]
        + [(Scope.SESSION, f"s{i}") for i in range(SESSIONS)]
        + [(Scope.GLOBAL, None)]
    )
    values = [
        lambda i: f"note {i} about something",
        lambda i: i,
        lambda i: {"n": i, "tags": ["a", "b"]},
        lambda i: [i, 0.5, None, True],
    ]
    batch = []
    for i in range(counts["fact"]):
        scope, owner = rng.choice(owners)
        key = f"key_{i}"
        value = values[i % 4](i)
        batch.append(
            Fact(
                key=key,
                value=value,
                scope=scope,
                fact_type=["world_knowledge", "user_preference"][i % 2],
                agent_id=owner if scope == Scope.AGENT else "",
                user_id=owner if scope == Scope.USER else None,
                session_id=owner if scope == Scope.SESSION else "",
                confidence=round(rng.uniform(0.1, 1.0), 3),
                times_confirmed=i % 4,
                source_episode_id=rng.choice(episode_ids) if i % 4 == 0 and episode_ids else None,
                provenance="consolidation" if i % 4 == 0 else "",
                access_count=i % 13,
                last_accessed=now - timedelta(seconds=i) if i % 2 else None,
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
    progress.remove_task(task)


class Tracker:
    """A progress callback: each kind (or phase) reports its own running count; the bar shows their sum."""

    def __init__(self, progress, task):
        self.progress, self.task, self.done = progress, task, {}

    def __call__(self, kind, done, total=None):
        self.done[kind] = done
        self.progress.update(self.task, completed=sum(self.done.values()))


def digest():
    """sha256 per table over every column of every row, by id; and the row count."""
    from memory.models import ChannelIdentity, Episode, Fact, MemoryUser, Procedure

    result, rows = {}, 0
    for model in (MemoryUser, ChannelIdentity, Episode, Procedure, Fact):
        h = hashlib.sha256()
        names = [f.attname for f in model._meta.concrete_fields]
        for values in model.objects.order_by("pk").values_list(*names).iterator(chunk_size=5000):
            h.update(repr(values).encode())
            rows += 1
        result[model.__name__] = h.hexdigest()
    return result, rows


def run(n, seed, progress, workdir):
    from django.db import connection

    from memory.models import Fact
    from memory.service import MemoryService

    rng = random.Random(seed)
    fill(n, rng, progress)
    service = MemoryService()
    service.optimize_search_index()
    before, rows = digest()
    # whoever owns this fact must find it by its text after the round trip (the search index was rebuilt)
    owner = Fact.objects.filter(key="key_12344").values("agent_id", "user_id", "session_id").get()
    results = {"rows": rows, "database": connection.vendor}
    path = Path(workdir) / "memories.jsonl"

    task = progress.add_task("exporting", total=rows)
    start = time.perf_counter()
    with path.open("w", encoding="utf-8") as out:
        service.export_memories(out, on_progress=Tracker(progress, task))
    export_s = time.perf_counter() - start
    progress.remove_task(task)
    results["file_mb"] = path.stat().st_size / 1e6

    start = time.perf_counter()
    deleted = service.clear_memories()
    results["clear_s"] = time.perf_counter() - start
    results["cleared"] = sum(deleted.values())
    empty = Fact.objects.count() == 0

    task = progress.add_task("validating, importing", total=2 * rows)
    start = time.perf_counter()
    with path.open(encoding="utf-8") as stream:
        report = service.import_memories(stream, on_progress=Tracker(progress, task))
    import_s = time.perf_counter() - start
    progress.remove_task(task)

    after, rows_after = digest()
    probe = service.search_facts("note 12344 about", **owner)
    results.update(
        export_s=export_s,
        import_s=import_s,
        export_rows_per_s=rows / export_s,
        import_rows_per_s=sum(report.added.values()) / import_s,
        roundtrip_equal=empty
        and before == after
        and rows_after == rows
        and sum(report.added.values()) == rows
        and [f.key for f in probe] == ["key_12344"],
    )
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.lifecycle", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="memories (rows) to export and import (default 100,000)")
    add_scratch_arguments(parser)
    args = parser.parse_args(argv)
    if args.n < 20_000:
        parser.error("--n must be at least 20,000 (the search probe reads fact key_12344)")
    err = Console(stderr=True)
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with tempfile.TemporaryDirectory(prefix="engram-lifecycle-") as workdir:
        with scratch_django(args.database_url), Progress(*columns, console=err, transient=True) as progress:
            results = run(args.n, args.seed, progress, workdir)
    if args.json:
        print(
            json.dumps(
                {
                    "rows": results["rows"],
                    "export_rows_per_s": round(results["export_rows_per_s"], 1),
                    "import_rows_per_s": round(results["import_rows_per_s"], 1),
                    "clear_s": round(results["clear_s"], 3),
                    "roundtrip_equal": results["roundtrip_equal"],
                }
            )
        )
        return 0
    table = Table(title=f"Export, clear, import of {results['rows']:,} memories ({results['database']})")
    table.add_column("step")
    table.add_column("seconds", justify="right")
    table.add_column("rows per second", justify="right")
    table.add_column("notes")
    table.add_row(
        "export",
        f"{results['export_s']:.2f}",
        f"{results['export_rows_per_s']:,.0f}",
        f"JSON Lines, {results['file_mb']:.1f} MB",
    )
    table.add_row("clear", f"{results['clear_s']:.2f}", "", f"{results['cleared']:,} rows deleted")
    table.add_row(
        "import",
        f"{results['import_s']:.2f}",
        f"{results['import_rows_per_s']:,.0f}",
        "validate the whole file, then insert in one transaction",
    )
    table.add_row(
        "round trip",
        "",
        "",
        "every column of every row equal" if results["roundtrip_equal"] else "[red]ROWS DIFFER[/red]",
    )
    Console().print(table)
    return 0 if results["roundtrip_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
