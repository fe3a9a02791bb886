"""Placement at fleet scale: the real `Placer.round` + `Placer.decide` over the fleet index,
beside a naive full least-allocated scan of the same workers, in the same run.

    .venv/bin/python loadtests/bench_placement.py [--sizes 100,1000,10000,100000]

For each size N, a synthetic region of N workers (mixed sizes and reservations; each
holds the layers of ~20 images drawn by Zipf popularity from 2,000 images of 5 layers
over 12 shared base layers) is published to an in-memory registry and loaded by a
`FleetIndex`; placement computes the top holders of every stored app's image at start
(`Placer.prewarm`), timed here as "pre-warm", and every image is decided once (the
first 200 timed: "first decision of an image"). All sizes live in one process; their
timed decisions are interleaved round by round (same app, every size), so that each
size sees the same state of the machine — caches, heap, collector — and the ratio
between sizes is the ratio of their costs, not of whose data happened to be in the
CPU's caches. The naive scans are interleaved the same way in a phase of their own,
and each size's decisions are timed once more back to back ("alone"), which is what a
process serving only that fleet sees. Timed with `perf_counter`, p50/p99 over all.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ground.appconfig import AppConfig, GuestConfig
from ground.registry.memory import MemoryRegistry
from ground.registry.types import WorkerStatus
from placement.core.failures import WorkerFailures
from placement.core.market import MarketParams
from placement.fleet.fleet import ImageInfo
from placement.fleet.fleetindex import FleetIndex
from placement.metrics import PlacementMetrics
from placement.placer import Placer

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
    """What `Placer` asks of `placement.fleet.fleet.Fleet` here: the clock, images and marks."""

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


@dataclass
class Setup:
    """One fleet of `n` workers in its index, its placer and the apps it decides for."""

    n: int
    index: FleetIndex
    registry: MemoryRegistry
    placer: Placer
    configs: dict[str, AppConfig]
    load_s: float = 0.0

    async def decision(self, name: str) -> float:
        """One timed `Placer.round` + `Placer.decide` of the app `name`, in seconds."""
        config = self.configs[name]
        t0 = time.perf_counter()
        rnd = await self.placer.round(config, "mad", [])
        decision = self.placer.decide(rnd)
        elapsed = time.perf_counter() - t0
        assert decision.ranked, "the bench fleet always has room"
        return elapsed

    def naive(self) -> float:
        t0 = time.perf_counter()
        naive_least_allocated(list(self.index.region("mad").workers.values()),
                              0.5, 512, NOW, 3.0)
        return time.perf_counter() - t0

    async def close(self) -> None:
        await self.index.stop()
        await self.registry.close()


async def setup(n: int, seed: int, apps: int = IMAGES) -> Setup:
    """The synthetic region of `n` workers, loaded by a `FleetIndex` (timed), and a placer
    over it with one app per image (the first `apps` images)."""
    rng = random.Random(seed)
    images = catalogue(rng)
    registry = MemoryRegistry(clock=lambda: 0.0)
    for worker in fleet(n, images, rng):
        await registry.publish_worker(worker, ttl_s=1e9)
    infos = {f"app-{i:04d}": ImageInfo(f"img{i}", f"sha256:{i:064x}", layers)
             for i, layers in enumerate(images[:apps])}
    index = FleetIndex(registry, hold_s=3.0)
    began = time.perf_counter()
    await index.start()
    load_s = time.perf_counter() - began
    placer = Placer(BenchFleet(registry, infos), None, MarketParams(),  # type: ignore[arg-type]
                    PlacementMetrics(), max_offers=3, decisions_kept=10,
                    rng=random.Random(seed), index=index)
    configs = {name: AppConfig(name=name, image=f"img-{name}", regions=["mad"],
                               guest=GuestConfig(cpus=0.5, memory_mb=512))
               for name in sorted(infos)}
    return Setup(n, index, registry, placer, configs, load_s)


async def prewarmed(bench: Setup) -> dict[str, float]:
    """`Placer.prewarm` of every app, as placement does at start for stored apps, timed
    with the loop's gaps and full collections meanwhile; then every image decided once
    (the first 200 timed: "first decision of an image")."""
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
    await bench.placer.prewarm(bench.configs.values())
    prewarm_s = time.perf_counter() - began
    gc.callbacks.remove(gc_timer)
    watcher.cancel()
    names = sorted(bench.configs)
    cold = [await bench.decision(name) for name in names[:200]]
    for name in names[200:]:
        await bench.decision(name)
    return {
        "n": bench.n, "load_s": bench.load_s, "prewarm_s": prewarm_s,
        "prewarm_block_ms": max(gaps, default=0.0) * 1e3,
        "prewarm_p99_ms": percentile(gaps, 0.99) * 1e3 if gaps else 0.0,
        "prewarm_gc_ms": max(gc_pauses, default=0.0) * 1e3,
        "cold_p50_ms": statistics.median(cold) * 1e3,
    }


async def measure(sizes: list[int], rounds: int, seed: int) -> list[dict[str, float]]:
    """Every size built and pre-warmed first, then three phases, each interleaving the
    sizes round by round so that all share the machine's state: `rounds` decisions per
    size; naive scans (fewer: one of 100,000 takes ~30 ms), apart, since a scan of the
    whole fleet between two decisions would flush the CPU caches they use; then each
    size's decisions back to back ("alone": its own data stay in the caches)."""
    benches = [await setup(n, seed) for n in sizes]
    rows = [await prewarmed(bench) for bench in benches]
    rng = random.Random(seed)
    names = sorted(benches[0].configs)
    picks = rng.choices(names, zipf_weights(len(names)), k=rounds)
    ours: list[list[float]] = [[] for _ in benches]
    for name in picks:
        for at, bench in enumerate(benches):
            ours[at].append(await bench.decision(name))
    naive: list[list[float]] = [[] for _ in benches]
    for _ in range(max(50, rounds // 10)):
        for at, bench in enumerate(benches):
            naive[at].append(bench.naive())
    alone: list[list[float]] = [[] for _ in benches]
    for at, bench in enumerate(benches):
        alone[at] = [await bench.decision(name) for name in picks[: rounds // 2]]
    for row, bench, times, scans, own in zip(rows, benches, ours, naive, alone, strict=True):
        row.update({
            "rounds": len(times),
            "p50_ms": statistics.median(times) * 1e3, "p99_ms": percentile(times, 0.99) * 1e3,
            "per_s": len(times) / sum(times),
            "alone_p50_ms": statistics.median(own) * 1e3,
            "alone_p99_ms": percentile(own, 0.99) * 1e3,
            "naive_p50_ms": statistics.median(scans) * 1e3,
            "naive_p99_ms": percentile(scans, 0.99) * 1e3,
        })
        await bench.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000,100000")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = asyncio.run(measure(sizes, args.rounds, args.seed))
    for row in rows:
        print(f"{row['n']:>7} workers: round+decide p50 {row['p50_ms']:.3f} ms, p99 "
              f"{row['p99_ms']:.3f} ms, {row['per_s']:.0f}/s (alone p50 "
              f"{row['alone_p50_ms']:.3f}, p99 {row['alone_p99_ms']:.3f}); cold image p50 "
              f"{row['cold_p50_ms']:.3f} ms; naive scan p50 {row['naive_p50_ms']:.3f} ms, "
              f"p99 {row['naive_p99_ms']:.3f} ms; index load {row['load_s']:.2f} s, "
              f"pre-warm {row['prewarm_s']:.2f} s (loop blocks p99 "
              f"{row['prewarm_p99_ms']:.1f} ms, longest {row['prewarm_block_ms']:.1f} ms, "
              f"longest full collection {row['prewarm_gc_ms']:.1f} ms)", flush=True)
    by_n = {int(row["n"]): row for row in rows}
    if 1_000 in by_n and 100_000 in by_n:
        big, small = by_n[100_000], by_n[1_000]
        print(f"100,000 / 1,000: interleaved p50 {big['p50_ms'] / small['p50_ms']:.2f}x, "
              f"p99 {big['p99_ms'] / small['p99_ms']:.2f}x; alone p50 "
              f"{big['alone_p50_ms'] / small['alone_p50_ms']:.2f}x, p99 "
              f"{big['alone_p99_ms'] / small['alone_p99_ms']:.2f}x")
    print()
    print("| workers | round+decide p50 / p99 (ms) | decisions/s "
          "| alone p50 / p99 (ms) | first decision of an image, p50 (ms) "
          "| naive least-allocated scan p50 / p99 (ms) | index load (s) "
          "| pre-warm (s) | its loop blocks p99 / longest (ms) "
          "| longest full GC meanwhile (ms) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']:,} | {r['p50_ms']:.3f} / {r['p99_ms']:.3f} | {r['per_s']:,.0f} "
              f"| {r['alone_p50_ms']:.3f} / {r['alone_p99_ms']:.3f} "
              f"| {r['cold_p50_ms']:.3f} | {r['naive_p50_ms']:.2f} / {r['naive_p99_ms']:.2f} "
              f"| {r['load_s']:.2f} | {r['prewarm_s']:.2f} "
              f"| {r['prewarm_p99_ms']:.1f} / {r['prewarm_block_ms']:.1f} "
              f"| {r['prewarm_gc_ms']:.1f} |")


if __name__ == "__main__":
    main()
