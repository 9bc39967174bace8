"""One benchmark at two commits, interleaved: the figures of this checkout against an older commit's.

    python -m bench.compare --against COMMIT [--new COMMIT] [--runs 3] BENCH [BENCH'S ARGUMENTS ...]
    python -m bench.compare --against fe5f142 facts --n 20000 --mode hybrid
    python -m bench.compare --modes [--runs 3] BENCH [BENCH'S ARGUMENTS ...]

Checks the older commit out into a temporary git worktree and runs `python -m bench.BENCH ... --json`
there and here by turns (old, new, new, old, ...: neither always runs first), each in its own process
with this interpreter. A benchmark run from a checkout imports that checkout's code: the working
directory comes first on the module path. Prints, for every number both JSON objects hold (nested
keys joined with dots), the median of each side and new / old, then the machine reference; with
--json, one JSON object. With --modes, this checkout in keyword-only mode ("old") against itself in
hybrid mode ("new"), by turns the same way: what semantic memory costs. Whether a higher figure is better depends on the figure (rates: yes,
latencies: no); the table says neither.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile

from rich.console import Console
from rich.table import Table

from .support.checkouts import checkouts, short
from .support.scratch import REPO, machine_reference


def numbers(obj, prefix=""):
    """{dotted key: number} of every int or float in a JSON object (booleans are not numbers here)."""
    found = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            found.update(numbers(value, f"{prefix}{key}."))
    elif isinstance(obj, int | float) and not isinstance(obj, bool):
        found[prefix[:-1]] = obj
    return found


def run_once(tree, bench, arguments):
    command = [sys.executable, "-m", f"bench.{bench}", *arguments, "--json"]
    done = subprocess.run(command, cwd=tree, capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"bench.{bench} failed in {tree} (exit {done.returncode})")
    return numbers(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="the older commit (anything git rev-parse takes)")
    parser.add_argument(
        "--modes", action="store_true", help="this checkout, --mode keyword against --mode hybrid, instead of commits"
    )
    parser.add_argument("--new", help="a newer commit to measure instead of this checkout as it is")
    parser.add_argument("--runs", type=int, default=3, help="runs of each side (default 3)")
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object")
    parser.add_argument("bench", help="the benchmark module's name under bench/, e.g. facts")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="the benchmark's own arguments")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if bool(args.modes) == bool(args.against) or args.modes and args.new:
        parser.error("give either --against COMMIT (and perhaps --new) or --modes")
    if args.modes:
        return compare_modes(args)
    commit, new_commit = (short(c) if c else None for c in (args.against, args.new))
    results = {"old": [], "new": []}
    with (
        tempfile.TemporaryDirectory(prefix="engram-compare-") as scratch,
        checkouts(scratch, commit, new_commit) as trees,
    ):
        for n in range(args.runs):
            order = ("old", "new") if n % 2 == 0 else ("new", "old")
            for side in order:
                print(f"run {n + 1}/{args.runs}: {side}", file=sys.stderr, flush=True)
                results[side].append(run_once(trees[side], args.bench, args.arguments))
    report(args, results, commit, new_commit or "checkout", new_commit or "this checkout")
    return 0


def compare_modes(args):
    results = {"old": [], "new": []}
    for n in range(args.runs):
        order = ("old", "new") if n % 2 == 0 else ("new", "old")
        for side in order:
            mode = "keyword" if side == "old" else "hybrid"
            print(f"run {n + 1}/{args.runs}: {mode}", file=sys.stderr, flush=True)
            results[side].append(run_once(REPO, args.bench, [*args.arguments, "--mode", mode]))
    report(args, results, "keyword", "hybrid", "hybrid")
    return 0


def report(args, results, commit, new_name, now):
    keys = [k for k in results["new"][0] if all(k in r for r in results["old"] + results["new"])]
    rows = {}
    for key in keys:
        old = statistics.median(r[key] for r in results["old"])
        new = statistics.median(r[key] for r in results["new"])
        rows[key] = {"old": old, "new": new, "new_over_old": round(new / old, 3) if old else None}
    reference = machine_reference()
    if args.json:
        print(
            json.dumps(
                {
                    "bench": args.bench,
                    "against": commit,
                    "new": new_name,
                    "runs": args.runs,
                    "figures": rows,
                    "machine": reference,
                }
            )
        )
        return
    table = Table(title=f"bench.{args.bench} {' '.join(args.arguments)}: {now} against {commit}")
    for column in ("figure", f"{commit} (median)", f"{now} (median)", "new / old"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    for key, row in rows.items():
        ratio = "" if row["new_over_old"] is None else f"{row['new_over_old']:.3f}"
        table.add_row(key, f"{row['old']:g}", f"{row['new']:g}", ratio)
    console = Console()
    console.print(table)
    console.print(reference)


if __name__ == "__main__":
    raise SystemExit(main())
