"""Older commits checked out beside this one, for the benchmarks that compare two commits
(bench.compare, bench.instructions)."""

import contextlib
import subprocess
from pathlib import Path

from .scratch import REPO


def short(ref):
    """The short hash of a commit (anything `git rev-parse` takes)."""
    done = subprocess.run(["git", "rev-parse", "--short", ref], cwd=REPO, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@contextlib.contextmanager
def checkouts(scratch, commit, new_commit=None):
    """{"old": tree, "new": tree}: `commit` (and `new_commit`, else this checkout) as temporary git
    worktrees in the folder `scratch`, removed again on the way out."""
    trees = {"old": Path(scratch) / "old", "new": Path(scratch) / "new" if new_commit else REPO}
    made = []
    try:
        for side, ref in (("old", commit), ("new", new_commit)):
            if ref:
                subprocess.run(
                    ["git", "worktree", "add", "--detach", "-q", str(trees[side]), ref], cwd=REPO, check=True
                )
                made.append(trees[side])
        yield trees
    finally:
        for tree in made:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)
