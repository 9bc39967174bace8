"""Concurrent merges: A->B while B->C, and A->B while B->A, started together on two connections.

    python -m bench.merges [--trials 40] [--database-url postgres://postgres@127.0.0.1:5432/postgres] [--json]

Each trial makes three users (each with an identity and a fact of its own), runs the two merges of
its kind in two threads that start at one barrier, each on its own database connection, and then
checks the merge rule:

- no broken chain: every merged user's `merged_into` names a user that is not merged itself;
- every user of the trial resolves to one survivor, whose `get_fact` finds each user's fact by any of
  their old ids;
- forgetting the survivor (`delete_users(cascade=True)`) leaves none of the trial's users behind;
- no raw error: a merge either succeeds or is refused with `MemoryConflict` (nothing left to merge).

`--json` prints {"database", "trials", "broken_chains", "raw_errors", "refused", "lost_facts", "leftovers"}.
"""

import argparse
import json
import sys
import threading
import uuid

from rich.console import Console
from rich.table import Table

from .support.scratch import add_scratch_arguments, machine_reference, scratch_django

KINDS = {"chain": (("a", "b"), ("b", "c")), "swap": (("a", "b"), ("b", "a"))}


def run_together(calls):
    """Run the callables at once in threads (one DB connection each); their (result, exception) pairs."""
    from django.db import connection

    barrier = threading.Barrier(len(calls))
    outcomes = [None] * len(calls)

    def run(n):
        try:
            barrier.wait(timeout=30)
            outcomes[n] = (calls[n](), None)
        except Exception as exc:  # noqa: BLE001  (the caller sorts expected refusals from raw errors)
            outcomes[n] = (None, exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if any(t.is_alive() for t in threads):
        raise RuntimeError("a merge hung")
    return outcomes


def trial(service, kind):
    """One trial of `kind` ("chain" or "swap"); a dict of what went wrong (all zeros when the rule held)."""
    from memory.exceptions import MemoryConflict
    from memory.models import MemoryUser

    tag = uuid.uuid4().hex[:10]
    users = {}
    for name in "abc":
        user, _ = service.get_or_create_user("bench", f"{tag}-{name}", display_name=f"user {name}")
        service.set_fact(f"note_{name}", f"from {name}", scope="user", user_id=user.pk)
        users[name] = user.pk
    merges = [lambda s=users[src], t=users[dst]: service.merge_users(s, t) for src, dst in KINDS[kind]]
    outcomes = run_together(merges)
    found = {"broken_chains": 0, "raw_errors": 0, "refused": 0, "lost_facts": 0, "leftovers": 0, "errors": []}
    for _, exc in outcomes:
        if isinstance(exc, MemoryConflict):
            found["refused"] += 1
        elif exc is not None:
            found["raw_errors"] += 1
            found["errors"].append(repr(exc))
    rows = {u.pk: u for u in MemoryUser.objects.filter(pk__in=users.values())}
    merged = {pk for pk, u in rows.items() if u.merged_into_id is not None}
    found["broken_chains"] = sum(1 for u in rows.values() if u.merged_into_id in merged)
    survivors = {service.resolve_user(pk).pk for pk in users.values()}
    involved = {users[n] for pair in KINDS[kind] for n in pair}
    if len({service.resolve_user(pk).pk for pk in involved}) != 1:
        found["broken_chains"] += 1
    for name, pk in users.items():
        for viewer in users.values():
            if service.resolve_user(viewer).pk != service.resolve_user(pk).pk:
                continue
            fact = service.get_fact(f"note_{name}", user_id=viewer)
            if fact is None or fact.value != f"from {name}":
                found["lost_facts"] += 1
    service.delete_users(sorted(survivors), cascade=True)
    found["leftovers"] = MemoryUser.objects.filter(pk__in=users.values()).count()
    return found


def run(trials, progress=None):
    from memory.service import MemoryService

    service = MemoryService()
    totals = {}
    for kind in KINDS:
        summary = {"trials": trials, "broken_chains": 0, "raw_errors": 0, "refused": 0, "lost_facts": 0, "leftovers": 0}
        errors = []
        for i in range(trials):
            found = trial(service, kind)
            errors.extend(found.pop("errors"))
            for key, value in found.items():
                summary[key] += value
            if progress:
                progress(kind, i + 1, trials)
        summary["first_errors"] = errors[:3]
        totals[kind] = summary
    return totals


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    add_scratch_arguments(parser, seed=False)
    args = parser.parse_args(argv)
    err = Console(stderr=True)
    with scratch_django(args.database_url):
        from django.db import connection

        vendor = connection.vendor
        totals = run(args.trials, lambda kind, i, n: err.print(f"{kind}: {i}/{n}", end="\r"))
    if args.json:
        print(
            json.dumps(
                {
                    "database": vendor,
                    **{f"{k}_{m}": v for k, s in totals.items() for m, v in s.items() if m != "first_errors"},
                }
            )
        )
        return 0 if all(s["broken_chains"] == s["raw_errors"] == 0 for s in totals.values()) else 1
    table = Table(title=f"Concurrent merges ({vendor}, two threads per trial)")
    for col in ("pair", "trials", "broken chains", "raw errors", "refused", "lost facts", "left after forget"):
        table.add_column(col, justify="right")
    for kind, s in totals.items():
        table.add_row(
            {"chain": "A->B | B->C", "swap": "A->B | B->A"}[kind],
            *(str(s[k]) for k in ("trials", "broken_chains", "raw_errors", "refused", "lost_facts", "leftovers")),
        )
    console = Console()
    console.print(table)
    for kind, s in totals.items():
        for line in s["first_errors"]:
            console.print(f"{kind}: {line}")
    console.print(machine_reference())
    return 0 if all(s["broken_chains"] == s["raw_errors"] == 0 for s in totals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
