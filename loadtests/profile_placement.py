"""cProfile of placement decisions at one fleet size: where a decision's time goes.

    .venv/bin/python loadtests/profile_placement.py [--workers 100000] [--decisions 3000]

The fleet, images and apps of loadtests/bench_placement.py; 300 images decided once
(their tops computed), then `--decisions` rounds + decisions drawn by Zipf popularity
under cProfile. Prints the time per decision under the profiler and the top functions
by own time. Compare two sizes in two runs: the profiler's overhead is per call, so
its ratio is the ratio of the work done, not of the memory it waits for.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.bench_placement import setup, zipf_weights


async def profile(n: int, decisions: int, top: int) -> None:
    bench = await setup(n, seed=1, apps=300)
    placer, configs = bench.placer, bench.configs
    names = sorted(configs)
    for name in names:
        placer.decide(await placer.round(configs[name], "mad", []))
    rng = random.Random(1)
    picks = rng.choices(names, zipf_weights(len(names)), k=decisions)
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
    args = parser.parse_args()
    asyncio.run(profile(args.workers, args.decisions, args.top))


if __name__ == "__main__":
    main()
