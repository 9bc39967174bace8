"""Instructions per operation under callgrind, at this checkout and at an older commit.

    python -m bench.instructions --against COMMIT [--new COMMIT] [--modes keyword,hybrid]
                                 [--groups facts,store,recall,webhook] [--n 10000] [--calls 200] [--jobs 2] [--json]

What is counted: the instructions the calling thread executes for one operation, averaged over CALLS
calls, after the setup and one uncounted call of the same operation. The operations are those of
bench.facts (get_fact, set_fact, search_facts on N filled facts), bench.store (EngramStore put, get,
search by filter and by query, list_namespaces over N items), bench.recall_latency (recall over N
documents, at one size, with no workspace current and inside the default one, as a workspace
member's request recalls) and bench.webhook (one Telegram update through Django's test client to the
demo workflow and its reply), each in keyword and hybrid mode. In hybrid mode the model's work is
not what is compared: the query embeddings of recall are cached by an uncounted pass, and documents
are embedded by the embedding worker's thread, which is not the calling thread.

Why instructions: a rate or latency on a shared machine moves with the load by more than most
changes do, even when the two sides are interleaved. Instruction counts under callgrind
(valgrind --tool=callgrind, switched on around the calls by client requests) come out the same from
one run to the next (hash seeds fixed) whatever else the machine does. They are not time: a cache
miss or a system call's wait costs no more instructions than a hit, so a change that moves
instructions little but I/O much needs the wall-clock benchmarks as well.

Each side runs bench/support/callgrind_workload.py from this checkout, with the side's tree first on
the module path (the older commit in a temporary git worktree, as bench.compare does), once per
group and mode, in its own valgrind process (--jobs at a time: counts do not depend on the load).
SQLite only (scratch databases). Prints per operation: old, new, new / old; --json: one object.
Needs valgrind with its headers (valgrind/callgrind.h) and a C compiler (cc) for the client requests.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .support.checkouts import checkouts, short
from .support.scratch import REPO, machine_reference

GROUPS = ("facts", "store", "recall", "webhook")
MODES = ("keyword", "hybrid")
WORKLOAD = Path(__file__).resolve().parent / "support" / "callgrind_workload.py"


def dump_totals(path):
    """The instructions a callgrind dump file holds (its "totals:" line)."""
    with open(path) as dump:
        for line in dump:
            if line.startswith("totals:"):
                return int(line.split()[1])
    raise ValueError(f"{path} has no totals line")


def count_side(tree, group, mode, n, calls, scratch):
    """{operation: instructions per call} of one group and mode at one tree, calling thread only."""
    side = "new" if Path(tree) == REPO else Path(tree).name
    folder = Path(tempfile.mkdtemp(prefix=f"{group}-{mode}-{side}-", dir=scratch))
    out = folder / "dumps.json"
    command = [
        "valgrind",
        "--tool=callgrind",
        "--separate-threads=yes",
        "--instr-atstart=no",
        f"--callgrind-out-file={folder / 'cg.out'}",
        sys.executable,
        str(WORKLOAD),
        *("--tree", str(tree), "--group", group, "--mode", mode, "--n", str(n), "--calls", str(calls)),
        *("--out", str(out)),
    ]
    env = {**__import__("os").environ, "PYTHONHASHSEED": "0", "ENGRAM_LOG_LEVEL": "WARNING", "PYTHONPATH": str(tree)}
    done = subprocess.run(command, cwd=tree, capture_output=True, text=True, env=env)
    if done.returncode or not out.exists():
        # One group failing (a workload an old commit cannot run, say) leaves the others' counts.
        sys.stderr.write(done.stderr[-4000:])
        sys.stderr.write(f"the {group} workload ({mode}) failed in {tree} (exit {done.returncode})\n")
        return {}
    dumps = json.loads(out.read_text())
    missing = [name for name, (number, _) in dumps.items() if not (folder / f"cg.out.{number}-01").exists()]
    if missing:
        sys.stderr.write(f"the {group} workload ({mode}) in {tree} wrote no dump for {', '.join(missing)}\n")
        return {}
    totals = {name: dump_totals(folder / f"cg.out.{number}-01") for name, (number, _) in dumps.items()}
    toggling = totals.pop("calibration")
    dumps.pop("calibration")
    return {name: (totals[name] - toggling) / dumps[name][1] for name in totals}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="the older commit (anything git rev-parse takes)")
    parser.add_argument("--new", help="a newer commit to count instead of this checkout as it is")
    parser.add_argument("--modes", default=",".join(MODES), help="keyword, hybrid or both (default both)")
    parser.add_argument("--groups", default=",".join(GROUPS), help=f"any of {', '.join(GROUPS)} (default all)")
    parser.add_argument("--n", type=int, default=10_000, help="facts, store items and recall documents (10,000)")
    parser.add_argument("--calls", type=int, default=200, help="counted calls of each operation (default 200)")
    parser.add_argument("--jobs", type=int, default=2, help="valgrind processes at a time (default 2)")
    parser.add_argument("--keep", help="a folder to copy the callgrind dumps to, for callgrind_annotate")
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object")
    args = parser.parse_args(argv)
    modes, groups = args.modes.split(","), args.groups.split(",")
    for name, given, allowed in (("--modes", modes, MODES), ("--groups", groups, GROUPS)):
        if not set(given) <= set(allowed):
            parser.error(f"{name} takes {', '.join(allowed)}; got {', '.join(sorted(set(given) - set(allowed)))}")
    if args.calls < 1 or args.n < 1000 or args.jobs < 1:
        parser.error("--calls and --jobs must be at least 1, --n at least 1,000")
    if not (shutil.which("valgrind") and shutil.which("cc") and Path("/usr/include/valgrind/callgrind.h").exists()):
        parser.error("needs valgrind, its header valgrind/callgrind.h and a C compiler (cc)")
    commit, new_commit = short(args.against), short(args.new) if args.new else None
    with (
        tempfile.TemporaryDirectory(prefix="engram-instructions-") as scratch,
        checkouts(scratch, commit, new_commit) as trees,
    ):
        jobs = [(side, group, mode) for group in groups for mode in modes for side in ("old", "new")]
        with ThreadPoolExecutor(args.jobs) as pool:
            counted = pool.map(lambda job: count_side(trees[job[0]], job[1], job[2], args.n, args.calls, scratch), jobs)
            results = dict(zip(jobs, counted))
        if args.keep:  # one folder per group, mode and side; cg.out.<dump>-01 is the calling thread
            shutil.copytree(scratch, args.keep, dirs_exist_ok=True, ignore=shutil.ignore_patterns("old", "new"))
    rows = []
    for group in groups:
        for mode in modes:
            old, new = results[("old", group, mode)], results[("new", group, mode)]  # {} where a side failed
            for op in old:
                if op in new:
                    ratio = round(new[op] / old[op], 3) if old[op] else None
                    rows.append(
                        {
                            "operation": op,
                            "mode": mode,
                            "old": round(old[op]),
                            "new": round(new[op]),
                            "new_over_old": ratio,
                        }
                    )
    reference = machine_reference()
    now = new_commit or "checkout"
    if args.json:
        print(
            json.dumps(
                {
                    "against": commit,
                    "new": now,
                    "n": args.n,
                    "calls": args.calls,
                    "database": "sqlite",
                    "operations": rows,
                    "machine": reference,
                }
            )
        )
        return 0
    table = Table(
        title=f"Instructions per call (calling thread, SQLite, n={args.n:,}, {args.calls} calls): {now} against {commit}"
    )
    for column in ("operation", "mode", commit, now, "new / old"):
        table.add_column(column, justify="left" if column in ("operation", "mode") else "right")
    for row in rows:
        ratio = "" if row["new_over_old"] is None else f"{row['new_over_old']:.3f}"
        table.add_row(row["operation"], row["mode"], f"{row['old']:,}", f"{row['new']:,}", ratio)
    console = Console()
    console.print(table)
    console.print(reference)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
