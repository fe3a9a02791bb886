"""Where a herd of cold wakes spends its time: one edge, one placement, three agents as
processes on one Redis; `--apps` apps (the tiny C server) woken at once; py-spy samples
the placement, one agent and the edge for the burst, and the services' debug logs give
each wake's phases (edge sent -> placement planned -> placed -> answered).

    .venv/bin/pip install py-spy     # once (not a test dependency)
    .venv/bin/python loadtests/profile_herd.py [--apps 200] [--seconds 3] [--stopped]

Prints the phases' p10/p50/p90, the Server-Timing parts, and each process's top
functions by self time (raw samples in /tmp/herd-profile-<service>.txt). Loopback
only; every process started is stopped; the work directory is removed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.bench_wakes import create, get_all, herd_platform, known, stop_all, timing
from loadtests.tinyapp import build_tiny_image
from tests.support.agent_process import wait_until
from tests.support.redis_server import start_redis_server

PY_SPY = Path(sys.executable).parent / "py-spy"
SERVICES = ("placement", "agent-0", "edge")


def quantiles(values: list[float]) -> str:
    v = sorted(values)
    if not v:
        return "-"
    return (f"p10 {v[len(v) // 10]:.0f} p50 {v[len(v) // 2]:.0f} "
            f"p90 {v[int(len(v) * 0.9)]:.0f} ms")


def events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def phases(tmp: Path) -> None:
    """Per wake: edge sent -> placement planned (lease, demand, registry read) -> placed
    (market round, offer) -> answered (pull, start, boot)."""
    sent = {e["app"]: e["ts"] - e["wake_ms"] / 1000 for e in events(tmp / "edge.log")
            if e.get("event") == "wake" and e.get("result") == "ok"}
    log = events(tmp / "placement.log")
    marks = {name: {e["app"]: e["ts"] for e in log if e.get("event") == name}
             for name in ("wake_planned", "placement", "wake_predicted")}
    apps = [a for a in sent if all(a in m for m in marks.values())]
    planned, placed, done = (marks["wake_planned"], marks["placement"],
                             marks["wake_predicted"])
    print(f"wakes with every phase logged: {len(apps)}")
    print("  edge sent -> planned:  ", quantiles([(planned[a] - sent[a]) * 1e3 for a in apps]))
    print("  planned -> placed:     ", quantiles([(placed[a] - planned[a]) * 1e3 for a in apps]))
    print("  placed -> answered:    ", quantiles([(done[a] - placed[a]) * 1e3 for a in apps]))


def self_time(path: Path, top: int = 12) -> None:
    counts: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rstrip().rpartition(" ")
        if stack:
            counts[stack.split(";")[-1]] += int(n)
            total += int(n)
    print(f"  {total} samples")
    for frame, n in counts.most_common(top):
        print(f"  {100 * n / total:5.1f}% {frame[:120]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--apps", type=int, default=200)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--stopped", action="store_true",
                        help="wake machines started and stopped before (prepared containers)")
    args = parser.parse_args()
    if not PY_SPY.exists():
        raise SystemExit(f"{PY_SPY} not found: .venv/bin/pip install py-spy")
    os.environ["THAW_TEST_LOG_LEVEL"] = "debug"  # the phases come from debug events
    work = Path(tempfile.mkdtemp(prefix="thaw-herd-profile-"))
    try:
        image = build_tiny_image(work / "herd" / "layout")
        with start_redis_server() as redis:
            with herd_platform(work / "herd", redis.url) as services:
                names = [f"herd{i}" for i in range(args.apps)]
                for name in names:
                    create(services, 0, name, image)
                wait_until(lambda: all(known(services, 0, n) for n in names[-5:]), 20, 0.1)
                if args.stopped:
                    stop_all(services, names)
                spies = [subprocess.Popen(
                    [str(PY_SPY), "record", "-p", str(services.procs[name].pid), "-d",
                     str(args.seconds), "-r", "200", "-f", "raw", "--nonblocking", "-o",
                     f"/tmp/herd-profile-{name}.txt"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for name in SERVICES]
                time.sleep(0.5)
                began = time.monotonic()
                answers = asyncio.run(get_all([(services.edge_ports[0], f"{n}.localhost", "/")
                                               for n in names]))
                print(f"{len(names)} wakes in {time.monotonic() - began:.2f} s:",
                      dict(Counter(status for status, _, _ in answers)))
                for part in ("hold", "place", "pull", "boot"):
                    print(f"  Server-Timing {part}:", quantiles(
                        [timing(st, part) for status, _, st in answers if status == 200]))
                for spy in spies:
                    spy.wait(timeout=args.seconds + 30)
            phases(work / "herd")
            for name in SERVICES:
                print(f"{name}, self time:")
                self_time(Path(f"/tmp/herd-profile-{name}.txt"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
