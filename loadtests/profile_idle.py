"""Where an idle edge's time goes, by Python function: py-spy samples `thaw edge` with
nothing to do (the setup of instr_idle.py: a Redis of its own, `--apps` apps with a
started machine each, no request) and prints the functions in the most samples,
inclusive. The compiled edge's own functions do not show (py-spy sees Python frames);
the loops around them (redis-py, asyncio, the load share, the feed) do.

    PATH=$PATH:.venv/bin .venv/bin/python loadtests/profile_idle.py [--apps 100] [--seconds 40]
                                                                  [--workers N]
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.benchlib import process, wait_port
from loadtests.instr_idle import edge_argv, heartbeats, seeded_redis


def inclusive(raw: Path, top: int) -> list[str]:
    """py-spy's collapsed stacks as (samples, function) lines, each function counted once
    a stack."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack:
            continue
        total += int(samples)
        for frame in {re.sub(r":\d+\)$", ")", f) for f in stack.split(";")}:
            counts[frame] += int(samples)
    return [f"{total} samples"] + [f"{n:6d}  {name}" for name, n in counts.most_common(top)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--apps", type=int, default=100)
    parser.add_argument("--seconds", type=int, default=40)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--workers", type=int, default=0,
                        help="workers heartbeating into the registry meanwhile")
    args = parser.parse_args()
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("needs py-spy (.venv/bin/pip install py-spy; PATH=$PATH:.venv/bin)")
    with tempfile.TemporaryDirectory(prefix="profile-idle-") as tmp:
        work = Path(tmp)
        with seeded_redis(work, args.apps) as url:
            argv, edge_port = edge_argv(url, work)
            with process(argv) as edge:
                wait_port(edge_port)
                stop = threading.Event()
                beating = threading.Thread(target=heartbeats,
                                           args=(url, args.workers, stop), daemon=True)
                if args.workers:
                    beating.start()
                time.sleep(5)
                raw = work / "stacks.txt"
                subprocess.run([spy, "record", "--pid", str(edge.pid), "--rate", "2000",
                                "--duration", str(args.seconds), "--format", "raw",
                                "--output", str(raw), "--nonblocking"],
                               check=True, capture_output=True)
                stop.set()
                print("\n".join(inclusive(raw, args.top)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
