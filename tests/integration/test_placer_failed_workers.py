"""The market offers nothing to a worker placement has marked failed while its heartbeat is
still fresh (two edges could not reach its machines), and trusts it again under a new
epoch: the real Placer over a real fleet index."""

from __future__ import annotations

import random

import pytest

from ground.appconfig import AppConfig, GuestConfig
from ground.registry.memory import MemoryRegistry
from ground.registry.types import WorkerStatus
from placement.core.failures import WorkerFailures
from placement.core.market import MarketParams
from placement.fleet.fleet import ImageInfo
from placement.fleet.fleetindex import FleetIndex
from placement.metrics import PlacementMetrics
from placement.placer import Placer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]
NOW = 1_000.0


class Fleet:
    """What Placer asks of placement.fleet.fleet.Fleet for a decision."""

    def __init__(self) -> None:
        self.failures = WorkerFailures(lambda: NOW)

    def clock(self) -> float:
        return NOW

    async def image(self, config: AppConfig) -> ImageInfo:
        return ImageInfo("img", "sha256:" + "0" * 64, {})


def worker(wid: str, epoch: int = 1) -> WorkerStatus:
    return WorkerStatus(id=wid, epoch=epoch, region="mad", url=f"http://{wid}", cpus=4.0,
                        memory_mb=4096, updated_at=NOW)


async def test_a_worker_marked_failed_is_offered_nothing_until_its_new_epoch() -> None:
    registry = MemoryRegistry(clock=lambda: NOW)
    for wid in ("w1", "w2"):
        await registry.publish_worker(worker(wid), ttl_s=1e9)
    index = FleetIndex(registry, hold_s=3.0, flush_interval_s=0.01)
    fleet = Fleet()
    placer = Placer(fleet, None, MarketParams(), PlacementMetrics(),  # type: ignore[arg-type]
                    max_offers=3, decisions_kept=10, rng=random.Random(1), index=index)
    config = AppConfig(name="app", image="img", regions=["mad"],
                       guest=GuestConfig(cpus=0.5, memory_mb=256))
    try:
        rnd = await placer.round(config, "mad", [])
        assert {c.worker for c in placer.decide(rnd).ranked} == {"w1", "w2"}
        fleet.failures.fail("w1", 1, "two edges could not reach its machines")
        assert [c.worker for c in placer.decide(rnd).ranked] == ["w2"]
        assert [c.worker for c in placer.decide(rnd, frozenset({"w2"})).ranked] == []
        index.apply(worker("w1", epoch=2))  # its agent restarted
        assert {c.worker for c in placer.decide(rnd).ranked} == {"w1", "w2"}
    finally:
        await placer.close()
        await index.stop()
        await registry.close()
