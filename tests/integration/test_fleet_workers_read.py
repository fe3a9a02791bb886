"""Placement's read of the workers (placement/fleet/fleet.py, `Fleet.workers`): callers
that ask while a read is under way share it, whatever becomes of it, and each caller's
own cancellation or the fleet's close is told apart."""

from __future__ import annotations

import asyncio

import pytest

from ground.registry import WorkerStatus
from ground.registry.memory import MemoryRegistry
from placement.errors import Unavailable
from placement.fleet.fleet import Fleet
from tests.support.memory_placement import NoLayersKept
from tests.support.memory_workers import MemoryWorkers


class GatedRegistry(MemoryRegistry):
    """The in-memory registry whose workers' reads are counted and wait for `gate`."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.gate = asyncio.Event()
        self.fail: Exception | None = None

    async def workers(self, region: str | None = None) -> list[WorkerStatus]:
        self.reads += 1
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return await super().workers(region)


async def fleet_of(registry: GatedRegistry) -> Fleet:
    workers = MemoryWorkers(registry)
    for wid in ("w1", "w2"):
        url = workers.add(wid, cpus=4, memory_mb=4096)
        await registry.publish_worker(workers.status(url), ttl_s=60)
    return Fleet(registry, workers, None, NoLayersKept(), 30.0, 10.0)  # type: ignore[arg-type]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_callers_during_a_read_share_it_and_a_later_one_reads_again() -> None:
    registry = GatedRegistry()
    fleet = await fleet_of(registry)
    calls = [asyncio.create_task(fleet.workers()) for _ in range(5)]
    await settle()
    assert registry.reads == 1
    registry.gate.set()
    found = await asyncio.gather(*calls)
    assert all(sorted(w.id for w in ws) == ["w1", "w2"] for ws in found)
    assert len(await fleet.workers()) == 2
    assert registry.reads == 2  # a read once the shared one ended: the registry as of now
    await fleet.close()


async def test_a_failed_read_fails_every_caller_that_shared_it_and_the_next_reads_again(
) -> None:
    registry = GatedRegistry()
    fleet = await fleet_of(registry)
    registry.fail = ConnectionError("registry away")
    calls = [asyncio.create_task(fleet.workers()) for _ in range(3)]
    await settle()
    registry.gate.set()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert [type(r) for r in results] == [ConnectionError] * 3
    registry.fail = None
    assert len(await fleet.workers()) == 2
    assert registry.reads == 2
    await fleet.close()


async def test_a_caller_cancelled_leaves_the_read_to_the_others() -> None:
    registry = GatedRegistry()
    fleet = await fleet_of(registry)
    gone, stays = asyncio.create_task(fleet.workers()), asyncio.create_task(fleet.workers())
    await settle()
    gone.cancel()
    await settle()
    registry.gate.set()
    assert len(await stays) == 2
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert registry.reads == 1
    await fleet.close()


async def test_closing_under_a_shared_read_tells_its_callers_unavailable_not_cancelled(
) -> None:
    registry = GatedRegistry()
    fleet = await fleet_of(registry)
    calls = [asyncio.create_task(fleet.workers()) for _ in range(2)]
    await settle()
    await fleet.close()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert [type(r) for r in results] == [Unavailable] * 2
