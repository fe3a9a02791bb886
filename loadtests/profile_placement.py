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

from loadtests import bench_placement as bench
from placement.core.market import MarketParams
from placement.fleet import ImageInfo
from placement.fleetindex import FleetIndex
from placement.metrics import PlacementMetrics
from placement.placer import Placer
from thaw.appconfig import AppConfig, GuestConfig
from thaw.registry.memory import MemoryRegistry


async def profile(n: int, decisions: int, top: int) -> None:
    rng = random.Random(1)
    images = bench.catalogue(rng)
    registry = MemoryRegistry(clock=lambda: 0.0)
    for worker in bench.fleet(n, images, rng):
        await registry.publish_worker(worker, ttl_s=1e9)
    infos = {f"app-{i:04d}": ImageInfo(f"img{i}", f"sha256:{i:064x}", layers)
             for i, layers in enumerate(images)}
    index = FleetIndex(registry, hold_s=3.0)
    await index.start()
    placer = Placer(bench.BenchFleet(registry, infos), None,  # type: ignore[arg-type]
                    MarketParams(), PlacementMetrics(), max_offers=3, decisions_kept=10,
                    rng=random.Random(1), index=index)
    names = sorted(infos)[:300]
    configs = {name: AppConfig(name=name, image=f"img-{name}", regions=["mad"],
                               guest=GuestConfig(cpus=0.5, memory_mb=512)) for name in names}
    for name in names:
        placer.decide(await placer.round(configs[name], "mad", []))
    picks = rng.choices(names, bench.zipf_weights(len(names)), k=decisions)
    profiler = cProfile.Profile()
    began = time.perf_counter()
    profiler.enable()
    for name in picks:
        placer.decide(await placer.round(configs[name], "mad", []))
    profiler.disable()
    took = time.perf_counter() - began
    print(f"{n:,} workers: {took / decisions * 1e6:.0f} µs per decision under cProfile")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)
    await index.stop()
    await registry.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=100_000)
    parser.add_argument("--decisions", type=int, default=3000)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    asyncio.run(profile(args.workers, args.decisions, args.top))


if __name__ == "__main__":
    main()
