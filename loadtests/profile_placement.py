"""cProfile of placement decisions at one fleet size: where a decision's time goes.

    .venv/bin/python loadtests/profile_placement.py [--workers 100000] [--decisions 3000]
        [--phases]

The fleet, images and apps of loadtests/bench_placement.py; 300 images decided once
(their tops computed), then `--decisions` rounds + decisions drawn by Zipf popularity
under cProfile. Prints the time per decision under the profiler and the top functions
by own time. Compare two sizes in two runs: the profiler's overhead is per call, so
its ratio is the ratio of the work done, not of the memory it waits for.

`--phases` times the decision's parts instead (the index's top holders and random
draws, the ledger's view, the filters and the score of each candidate) with
`perf_counter` around each call: µs per decision in each, wall time, memory waits
included.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.bench_placement import setup, zipf_weights

PHASES = (("placement.core.index", "RegionIndex", "top_holders"),
          ("placement.core.index", "RegionIndex", "draw"),
          ("placement.core.index", "ReservationLedger", "view"),
          ("placement.core.market", None, "admissible"),
          ("placement.core.market", None, "score_default"))


def time_phases() -> dict[str, list[float]]:
    """Wrap each of PHASES with a timer; the times taken, by name, as calls are made."""
    spent: dict[str, list[float]] = {}
    for module_name, owner_name, name in PHASES:
        module = sys.modules[module_name]
        owner = getattr(module, owner_name) if owner_name else module
        inner = getattr(owner, name)
        times = spent.setdefault(f"{owner_name + '.' if owner_name else ''}{name}", [])

        def timed(*args: Any, inner: Any = inner, times: list[float] = times) -> Any:
            began = time.perf_counter()
            result = inner(*args)
            times.append(time.perf_counter() - began)
            return result

        setattr(owner, name, timed)
    return spent


async def profile(n: int, decisions: int, top: int, phases: bool = False) -> None:
    bench = await setup(n, seed=1, apps=300)
    placer, configs = bench.placer, bench.configs
    names = sorted(configs)
    for name in names:
        placer.decide(await placer.round(configs[name], "mad", []))
    rng = random.Random(1)
    picks = rng.choices(names, zipf_weights(len(names)), k=decisions)
    if phases:
        spent = time_phases()
        began = time.perf_counter()
        for name in picks:
            placer.decide(await placer.round(configs[name], "mad", []))
        took = time.perf_counter() - began
        print(f"{n:,} workers: {took / decisions * 1e6:.0f} µs per decision, timed in parts")
        for part, times in spent.items():
            print(f"  {part:<28} {sum(times) / decisions * 1e6:7.1f} µs per decision "
                  f"({len(times) / decisions:.1f} calls)")
        await bench.close()
        return
    profiler = cProfile.Profile()
    began = time.perf_counter()
    profiler.enable()
    for name in picks:
        placer.decide(await placer.round(configs[name], "mad", []))
    profiler.disable()
    took = time.perf_counter() - began
    print(f"{n:,} workers: {took / decisions * 1e6:.0f} µs per decision under cProfile")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)
    await bench.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=100_000)
    parser.add_argument("--decisions", type=int, default=3000)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--phases", action="store_true",
                        help="time the decision's parts instead of profiling")
    args = parser.parse_args()
    asyncio.run(profile(args.workers, args.decisions, args.top, args.phases))


if __name__ == "__main__":
    main()
