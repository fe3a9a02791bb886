"""A/B of the edge's Python per request between two git revisions, with micro_edge.py.

    taskset -c 0 .venv/bin/python loadtests/ab_micro.py OLD [NEW] [--rounds 6] [--native]

Checks each revision out into a temporary git worktree (NEW defaults to the
working tree as it is), copies this tree's micro_edge.py and floor_proxy.py
into it (so both sides are measured the same way), then alternates
`micro_edge.py --json` runs of the two `--rounds` times and prints the median
and every run's median µs per request of each. Pure Python by default
(`THAW_NATIVE=0`; a worktree has no native build); the worktrees are removed at
the end. This is how each warm-path change in docs/benchmarks.md was judged.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HARNESS = ("loadtests/micro_edge.py", "loadtests/floor_proxy.py")


def checkout(rev: str, into: Path) -> Path:
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(into), rev],
                   check=True)
    for path in HARNESS:
        shutil.copy(REPO / path, into / path)
    return into


def edge_median(tree: Path, native: bool) -> float:
    env = {**os.environ, "THAW_NATIVE": "1" if native else "0"}
    out = subprocess.run([sys.executable, str(tree / HARNESS[0]), "--json", "--repeat", "5"],
                         cwd=tree, env=env, check=True, capture_output=True, text=True).stdout
    return statistics.median(json.loads(out)["edge"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old")
    parser.add_argument("new", nargs="?", help="a revision (default: the working tree)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--native", action="store_true", help="do not set THAW_NATIVE=0")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="thaw-ab-") as tmp:
        trees: dict[str, Path] = {}
        try:
            trees[args.old] = checkout(args.old, Path(tmp, "old"))
            trees[args.new or "working tree"] = (checkout(args.new, Path(tmp, "new"))
                                                 if args.new else REPO)
            runs: dict[str, list[float]] = {name: [] for name in trees}
            for _ in range(args.rounds):
                for name, tree in trees.items():
                    runs[name].append(edge_median(tree, args.native))
            for name, values in runs.items():
                print(f"{name}: median {statistics.median(values):.2f} µs/request, runs "
                      + ", ".join(f"{v:.2f}" for v in sorted(values)))
        finally:
            for tree in trees.values():
                if tree != REPO:
                    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                                    str(tree)], check=False)


if __name__ == "__main__":
    main()
