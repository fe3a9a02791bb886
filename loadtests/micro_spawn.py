"""What one short command costs the process that runs it: asyncio's
`create_subprocess_exec` under uvloop (a fork of the whole process on the loop) against
`ground.spawn.run` (CPython's subprocess in a thread: vfork), in a process holding
`--ballast` MiB (an agent holds ~100), rounds interleaved.

    .venv/bin/python loadtests/micro_spawn.py [--calls 200] [--rounds 3]
        [--ballast 0 30 100] [--no-write]

Prints, per way and size, the caller's own CPU (getrusage, children not counted) and
the wall time per call of `/bin/true`, medians over rounds; writes docs/benchmarks.md's
"Spawning off the loop" section.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ground import spawn
from loadtests.benchlib import machine_line, median, write_section


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def forked(calls: int) -> None:
    for _ in range(calls):
        proc = await asyncio.create_subprocess_exec(
            "/bin/true", stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        await proc.communicate()


async def in_thread(calls: int) -> None:
    for _ in range(calls):
        await spawn.run(["/bin/true"], timeout_s=10)


WAYS = {"create_subprocess_exec (uvloop)": forked, "ground.spawn.run": in_thread}


async def measure(calls: int, rounds: int, sizes: list[int]) -> list[str]:
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    ballast: list[bytearray] = []
    for size in sorted(sizes):
        while len(ballast) < size:  # touched, so that its pages are mapped
            block = bytearray(1 << 20)
            block[::4096] = b"x" * len(block[::4096])
            ballast.append(block)
        for _ in range(rounds):
            for name, way in WAYS.items():
                cpu, began = own_cpu_s(), time.perf_counter()
                await way(calls)
                results.setdefault((name, size), []).append(
                    ((own_cpu_s() - cpu) / calls * 1000,
                     (time.perf_counter() - began) / calls * 1000))
    rows = ["| way | process MiB (ballast) | caller CPU ms a call | wall ms a call |",
            "|---|---|---|---|"]
    for (name, size), runs in results.items():
        rows.append(f"| {name} | +{size} | {median([c for c, _ in runs]):.2f} | "
                    f"{median([w for _, w in runs]):.2f} |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ballast", type=int, nargs="+", default=[0, 30, 100])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rows = uvloop.run(measure(args.calls, args.rounds, args.ballast))
    body = "\n".join([
        "## Spawning off the loop (`loadtests/micro_spawn.py`, issue 28)", "",
        f"Machine: {machine_line()}", "",
        f"Command: `.venv/bin/python loadtests/micro_spawn.py --calls {args.calls} "
        f"--rounds {args.rounds} --ballast {' '.join(map(str, args.ballast))}`", "",
        "`/bin/true` run to its end, one call at a time, from a uvloop process holding the "
        "ballast; medians over interleaved rounds. The caller's CPU is its own "
        "(getrusage RUSAGE_SELF): the fork's copy of page tables is charged to it.", "",
        *rows, "",
        "The agent's runtime calls (`runc create/start/kill/delete/state`), its `ip -batch` "
        "and `nft -f` and the edge's `nft -f` go through `ground.spawn.run` "
        "(docs/agent.md).",
    ])
    if not args.no_write:
        write_section("micro-spawn", body)


if __name__ == "__main__":
    main()
