"""The fleet index fed from a real registry (in memory, and a real redis-server): loaded at
start, kept by the change feed worker by worker, and reloaded after a feed error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from ground.registry.memory import MemoryRegistry
from ground.registry.redis import RedisRegistry
from ground.registry.types import ROUTES, Change, Feed, WorkerStatus
from placement.fleet.fleetindex import FleetIndex
from tests.support.loopturns import LoopTurns
from tests.support.placement_helpers import eventually
from tests.support.redis_server import RedisServer, start_redis_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def worker(wid: str, region: str = "mad", **fields: Any) -> WorkerStatus:
    return WorkerStatus(id=wid, epoch=1, region=region, url=f"http://{wid}", cpus=4.0,
                        memory_mb=4096, updated_at=1_000.0, **fields)


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    server: RedisServer
    with start_redis_server() as server:
        yield server.url


@pytest.fixture(params=["memory", "redis"])
async def registry(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    if request.param == "memory":
        backend: Any = MemoryRegistry()
    else:
        backend = RedisRegistry(request.getfixturevalue("redis_url"))
        await backend._r.flushall()
    yield backend
    await backend.close()


async def test_start_loads_every_worker_by_region_then_follows_changes(registry: Any) -> None:
    for i in range(5):
        await registry.publish_worker(worker(f"w{i}", "mad" if i < 3 else "fra"), ttl_s=30)
    index = FleetIndex(registry, hold_s=3.0, flush_interval_s=0.01)
    await index.start()
    try:
        assert sorted(index.region("mad").workers) == ["w0", "w1", "w2"]
        assert sorted(index.region("fra").workers) == ["w3", "w4"]
        await registry.publish_worker(worker("w5", layers={"sha256:a": 10}), ttl_s=30)
        await registry.publish_worker(worker("w0", "fra"), ttl_s=30)  # moved
        await registry.set_worker_layers("w5", {"sha256:a": 10})

        async def followed() -> bool:
            return sorted(index.region("mad").workers) == ["w1", "w2", "w5"]

        await eventually(followed, timeout_s=10)
        assert sorted(index.region("fra").workers) == ["w0", "w3", "w4"]
        assert index.region("mad").holders == {"sha256:a": {"w5": 10}}
        assert [w.id for w in index.region("mad").top_holders({"sha256:a": 10}, 3)] == ["w5"]
    finally:
        await index.stop()


async def test_a_worker_whose_heartbeat_expired_leaves_the_index_at_the_next_flush(
    registry: Any,
) -> None:
    await registry.publish_worker(worker("w-short"), ttl_s=0.3)
    await registry.publish_worker(worker("w-long"), ttl_s=30)
    index = FleetIndex(registry, hold_s=3.0, flush_interval_s=0.01)
    await index.start()
    try:
        assert sorted(index.region("mad").workers) == ["w-long", "w-short"]
        await asyncio.sleep(0.4)
        await registry.publish_worker(worker("w-long", reserved_cpus=1.0), ttl_s=30)

        async def expired() -> bool:
            return list(index.region("mad").workers) == ["w-long"]

        await eventually(expired, timeout_s=10)
        assert index.region("mad").workers["w-long"].reserved_cpus == 1.0
    finally:
        await index.stop()


class BrokenFeed:
    """A registry whose change feed fails once, after the load."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.failed = False

    async def workers(self, region: str | None = None) -> list[WorkerStatus]:
        workers: list[WorkerStatus] = await self.inner.workers(region)
        return workers

    async def feed_position(self, feed: Feed = ROUTES) -> str:
        position: str = await self.inner.feed_position(feed)
        return position

    async def changes(self, after: str | None = None, block_s: float | None = None,
                      feed: Feed = ROUTES) -> AsyncIterator[Change]:
        if not self.failed:
            self.failed = True
            raise ConnectionError("feed down")
        async for change in self.inner.changes(after, block_s, feed):
            yield change


async def test_after_a_feed_error_the_index_is_reloaded_and_following_resumes(
    registry: Any,
) -> None:
    await registry.publish_worker(worker("w0"), ttl_s=30)
    index = FleetIndex(BrokenFeed(registry), hold_s=3.0, flush_interval_s=0.01)
    await index.start()
    try:
        await registry.publish_worker(worker("w1"), ttl_s=30)  # while the feed is down

        async def reloaded() -> bool:
            return sorted(index.region("mad").workers) == ["w0", "w1"]

        await eventually(reloaded, timeout_s=10)
        await registry.publish_worker(worker("w2"), ttl_s=30)

        async def followed() -> bool:
            return "w2" in index.region("mad").workers

        await eventually(followed, timeout_s=10)
    finally:
        await index.stop()


async def test_a_load_of_many_workers_yields_to_the_loop_between_slices() -> None:
    registry = MemoryRegistry()
    for i in range(10_000):
        await registry.publish_worker(worker(f"w{i:05d}"), ttl_s=60)
    index = FleetIndex(registry, hold_s=3.0)
    async with LoopTurns() as turns:
        await index.start()
    await index.stop()
    assert len(index.region("mad")) == 10_000
    assert turns.count >= 10_000 // 2_000  # at least once per slice


class AwayOnce(BrokenFeed):
    """A registry that cannot be read at the first load."""

    async def workers(self, region: str | None = None) -> list[WorkerStatus]:
        if not self.failed:
            self.failed = True
            raise ConnectionError("registry away")
        return await super().workers(region)


async def test_a_start_that_failed_while_the_registry_was_away_is_tried_again() -> None:
    registry = MemoryRegistry()
    await registry.publish_worker(worker("w0"), ttl_s=30)
    index = FleetIndex(AwayOnce(registry), hold_s=3.0)
    with pytest.raises(ConnectionError):
        await index.start()
    await index.start()
    try:
        assert list(index.region("mad").workers) == ["w0"]
    finally:
        await index.stop()


async def test_prewarm_computes_the_image_tops_before_any_decision() -> None:
    registry = MemoryRegistry()
    image = {"sha256:base": 50, "sha256:own": 10}
    for i in range(6):
        layers = image if i % 2 else {"sha256:base": 50}
        await registry.publish_worker(worker(f"w{i}", layers=layers), ttl_s=30)
    index = FleetIndex(registry, hold_s=3.0)
    await index.start()
    try:
        mad = index.region("mad")
        assert not mad.knows_top(image, 2)
        assert await index.prewarm([("mad", image), ("fra", {}), ("mad", image)], 2) == 2
        assert mad.knows_top(image, 2)
        assert [w.id for w in mad.top_holders(image, 2)] == ["w1", "w3"]
        # kept exact as holders change: a worker that gains the image joins the top
        await registry.publish_worker(worker("w0", layers=image), ttl_s=30)
        await eventually(lambda: _async([w.id for w in mad.top_holders(image, 2)]
                                        == ["w0", "w1"]), timeout_s=5)
        assert mad.knows_top(image, 2)
    finally:
        await index.stop()
    await registry.close()


async def _async(value: bool) -> bool:
    return value
