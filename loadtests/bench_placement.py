"""Placement at fleet scale: the real `Placer.round` + `Placer.decide` over the fleet index,
beside a naive full least-allocated scan of the same workers, in the same run.

    .venv/bin/python loadtests/bench_placement.py [--sizes 100,1000,10000,100000]

A synthetic region of N workers (mixed sizes and reservations; each holds the layers of
~20 images drawn by Zipf popularity from 2,000 images of 5 layers over 12 shared base
layers) is published to an in-memory registry and loaded by a `FleetIndex`. Rounds of
the two are interleaved (one placer decision, one naive scan, ...) and timed each with
`perf_counter`; p50/p99 are over all timed rounds after a warm-up that touches every
image once. Placement computes the top holders of every stored app's image at start
(`Placer.prewarm`), timed here as "pre-warm"; the first decision of each image after it
is reported apart.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from placement.core.failures import WorkerFailures
from placement.core.market import MarketParams
from placement.fleet import ImageInfo
from placement.fleetindex import FleetIndex
from placement.metrics import PlacementMetrics
from placement.placer import Placer
from thaw.appconfig import AppConfig, GuestConfig
from thaw.registry.memory import MemoryRegistry
from thaw.registry.types import WorkerStatus

IMAGES = 2_000
BASE_LAYERS = 12
IMAGES_PER_WORKER = 20
NOW = 1_000_000.0


def catalogue(rng: random.Random) -> list[dict[str, int]]:
    """2,000 images of 5 layers: 2 shared base layers (of 12) + 3 of their own."""
    bases = {f"sha256:base{b:02d}": rng.randint(20, 80) * 2**20 for b in range(BASE_LAYERS)}
    base_names = sorted(bases)
    images = []
    for i in range(IMAGES):
        layers = {d: bases[d] for d in rng.sample(base_names, 2)}
        for j in range(3):
            layers[f"sha256:img{i:04d}l{j}"] = rng.randint(1, 60) * 2**20
        images.append(layers)
    return images


def zipf_weights(n: int, s: float = 1.1) -> list[float]:
    return [1 / (rank ** s) for rank in range(1, n + 1)]


def fleet(n: int, images: list[dict[str, int]], rng: random.Random) -> list[WorkerStatus]:
    weights = zipf_weights(len(images))
    workers = []
    for i in range(n):
        cpus, memory = rng.choice([(4.0, 8192), (8.0, 16384), (16.0, 32768)])
        used = rng.uniform(0.0, 0.9)
        layers: dict[str, int] = {}
        for image in rng.choices(images, weights, k=IMAGES_PER_WORKER):
            layers.update(image)
        workers.append(WorkerStatus(
            id=f"w{i:06d}", epoch=1, region="mad", url=f"http://w{i}", cpus=cpus,
            memory_mb=memory, reserved_cpus=round(cpus * used, 2),
            reserved_memory_mb=int(memory * used), layers=layers, updated_at=NOW))
    return workers


def naive_least_allocated(workers: list[WorkerStatus], cpus: float, memory_mb: int,
                          now: float, freshness_s: float) -> str | None:
    """Today's simplest scheduler: scan every worker, keep the least allocated that fits."""
    best, best_used = None, 2.0
    for w in workers:
        if (w.region != "mad" or now - w.updated_at > freshness_s or w.draining
                or w.cpus - w.reserved_cpus < cpus
                or w.memory_mb - w.reserved_memory_mb < memory_mb):
            continue
        used = max((w.reserved_cpus + cpus) / w.cpus,
                   (w.reserved_memory_mb + memory_mb) / w.memory_mb)
        if used < best_used:
            best, best_used = w.id, used
    return best


class BenchFleet:
    """What `Placer` asks of `placement.fleet.Fleet` here: the clock, images and marks."""

    def __init__(self, registry: MemoryRegistry, images: dict[str, ImageInfo]) -> None:
        self.registry = registry
        self.images = images
        self.failures = WorkerFailures(self.clock)

    def clock(self) -> float:
        return NOW

    async def image(self, config: AppConfig) -> ImageInfo:
        return self.images[config.name]

    def remember(self, app: str, view: dict[str, Any]) -> None:
        pass


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(n: int, rounds: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    images = catalogue(rng)
    workers = fleet(n, images, rng)
    registry = MemoryRegistry(clock=lambda: 0.0)
    for w in workers:
        await registry.publish_worker(w, ttl_s=1e9)
    infos = {f"app-{i:04d}": ImageInfo(f"img{i}", f"sha256:{i:064x}", layers)
             for i, layers in enumerate(images)}
    params = MarketParams()
    index = FleetIndex(registry, hold_s=3.0)
    began = time.perf_counter()
    await index.start()
    load_s = time.perf_counter() - began
    placer = Placer(BenchFleet(registry, infos), None, params, PlacementMetrics(),  # type: ignore[arg-type]
                    max_offers=3, decisions_kept=10, rng=random.Random(seed), index=index)
    weights = zipf_weights(IMAGES)
    names = sorted(infos)
    configs = {name: AppConfig(name=name, image=f"img-{name}",
                               regions=["mad"], guest=GuestConfig(cpus=0.5, memory_mb=512))
               for name in names}

    async def one_placer_round(name: str) -> float:
        config = configs[name]
        t0 = time.perf_counter()
        rnd = await placer.round(config, "mad", [])
        decision = placer.decide(rnd)
        elapsed = time.perf_counter() - t0
        assert decision.ranked, "the bench fleet always has room"
        return elapsed

    gaps: list[float] = []

    async def watch_loop() -> None:  # the longest the loop went without a turn
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    gc_pauses: list[float] = []
    gc_began = [0.0]

    def gc_timer(phase: str, info: dict[str, int]) -> None:  # full collections' pauses
        if info.get("generation") != 2:
            return
        if phase == "start":
            gc_began[0] = time.perf_counter()
        else:
            gc_pauses.append(time.perf_counter() - gc_began[0])

    watcher = asyncio.create_task(watch_loop())
    gc.callbacks.append(gc_timer)
    began = time.perf_counter()
    await placer.prewarm(configs.values())  # as placement does at start, for stored apps
    prewarm_s = time.perf_counter() - began
    gc.callbacks.remove(gc_timer)
    watcher.cancel()
    prewarm_block_ms = max(gaps, default=0.0) * 1e3
    prewarm_p99_ms = percentile(gaps, 0.99) * 1e3 if gaps else 0.0
    prewarm_gc_ms = max(gc_pauses, default=0.0) * 1e3
    cold = [await one_placer_round(name) for name in names[: min(200, len(names))]]
    for name in names[200:]:
        await one_placer_round(name)  # every image decided once before the timed rounds
    ours: list[float] = []
    naive: list[float] = []
    for name in rng.choices(names, weights, k=rounds):
        ours.append(await one_placer_round(name))
        t0 = time.perf_counter()
        naive_least_allocated(list(index.region("mad").workers.values()), 0.5, 512, NOW, 3.0)
        naive.append(time.perf_counter() - t0)
    await index.stop()
    return {
        "n": n, "rounds": rounds, "load_s": load_s, "prewarm_s": prewarm_s,
        "prewarm_block_ms": prewarm_block_ms, "prewarm_gc_ms": prewarm_gc_ms,
        "prewarm_p99_ms": prewarm_p99_ms,
        "p50_ms": statistics.median(ours) * 1e3, "p99_ms": percentile(ours, 0.99) * 1e3,
        "cold_p50_ms": statistics.median(cold) * 1e3,
        "naive_p50_ms": statistics.median(naive) * 1e3,
        "naive_p99_ms": percentile(naive, 0.99) * 1e3,
        "per_s": len(ours) / sum(ours),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000,100000")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        rounds = args.rounds if n <= 10_000 else max(200, args.rounds // 4)
        row = asyncio.run(measure(n, rounds, args.seed))
        rows.append(row)
        print(f"{n:>7} workers: round+decide p50 {row['p50_ms']:.3f} ms, p99 "
              f"{row['p99_ms']:.3f} ms, {row['per_s']:.0f}/s; cold image p50 "
              f"{row['cold_p50_ms']:.3f} ms; naive scan p50 {row['naive_p50_ms']:.3f} ms, "
              f"p99 {row['naive_p99_ms']:.3f} ms; index load {row['load_s']:.2f} s, "
              f"pre-warm {row['prewarm_s']:.2f} s (loop blocks p99 "
              f"{row['prewarm_p99_ms']:.1f} ms, longest {row['prewarm_block_ms']:.1f} ms, "
              f"longest full collection "
              f"{row['prewarm_gc_ms']:.1f} ms)",
              flush=True)
    print()
    print("| workers | round+decide p50 / p99 (ms) | decisions/s "
          "| first decision of an image, p50 (ms) "
          "| naive least-allocated scan p50 / p99 (ms) | index load (s) "
          "| pre-warm (s) | its loop blocks p99 / longest (ms) "
          "| longest full GC meanwhile (ms) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']:,} | {r['p50_ms']:.3f} / {r['p99_ms']:.3f} | {r['per_s']:,.0f} "
              f"| {r['cold_p50_ms']:.3f} | {r['naive_p50_ms']:.2f} / {r['naive_p99_ms']:.2f} "
              f"| {r['load_s']:.2f} | {r['prewarm_s']:.2f} "
              f"| {r['prewarm_p99_ms']:.1f} / {r['prewarm_block_ms']:.1f} "
              f"| {r['prewarm_gc_ms']:.1f} |")


if __name__ == "__main__":
    main()
