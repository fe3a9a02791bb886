"""Placement's deciding parts — Fleet, fleet index, Placer — wired over workers in memory
(tests/support/memory_workers.py) and a registry in memory, for tests of the waker and
the reconciler without processes."""

from __future__ import annotations

import random
from dataclasses import dataclass

from ground.registry.memory import MemoryRegistry
from placement.core.market import MarketParams
from placement.fleet.fleet import Fleet
from placement.fleet.fleetindex import FleetIndex
from placement.metrics import PlacementMetrics
from placement.placer import Placer
from tests.support.memory_workers import MemoryWorkers


class NoLayersKept:
    """Pinned images with no layer lists kept: machines are placed by resources only."""

    async def layers(self, digest: str) -> dict[str, int] | None:
        return None


@dataclass
class MemoryPlacement:
    registry: MemoryRegistry
    workers: MemoryWorkers
    urls: dict[str, str]  # worker id -> url
    fleet: Fleet
    index: FleetIndex
    placer: Placer

    async def beat(self) -> None:
        """Every worker's heartbeat, as its agent publishes it (none for one that is down)."""
        for url, worker in self.workers.workers.items():
            if not worker.down:
                await self.registry.publish_worker(self.workers.status(url), ttl_s=60)

    def states(self) -> list[str]:
        """The states of every machine on every worker, sorted (the workers' own truth)."""
        return sorted(m.state.value for w in self.workers.workers.values()
                      for m in w.state.machines.values())

    def started_on(self) -> dict[str, list[str]]:
        """Worker id -> the ids of the machines started there."""
        return {w.id: sorted(m.id for m in w.state.machines.values()
                             if m.state.value == "started")
                for w in self.workers.workers.values()}

    async def close(self) -> None:
        await self.placer.close()
        await self.index.stop()
        await self.registry.close()


async def memory_placement(cpus: float, memory_mb: int,
                           worker_ids: tuple[str, ...] = ("w1", "w2")) -> MemoryPlacement:
    """Workers of `cpus` and `memory_mb` each, heartbeating; the fleet and a placer over
    them (a fixed random seed: the same choices every run)."""
    registry = MemoryRegistry()
    workers = MemoryWorkers(registry)
    urls = {wid: workers.add(wid, cpus=cpus, memory_mb=memory_mb) for wid in worker_ids}
    fleet = Fleet(registry, workers, None, NoLayersKept(), 30.0, 10.0)  # type: ignore[arg-type]
    index = FleetIndex(registry, hold_s=30.0, flush_interval_s=0.01)
    placer = Placer(fleet, workers, MarketParams(), PlacementMetrics(), max_offers=3,
                    decisions_kept=10, rng=random.Random(1), index=index)
    made = MemoryPlacement(registry, workers, urls, fleet, index, placer)
    await made.beat()
    return made
