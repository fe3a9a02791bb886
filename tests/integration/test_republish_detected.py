"""A lost registry is detected, not polled (placement/fleet/republish.py): with the safety
timer out of play and no pass or wake asking, a Redis restarted empty is noticed when
the change feed's connection is made again, a flushed one when a worker's heartbeat
names the new generation, and every stored app is published again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from ground.appconfig import AppConfig
from ground.registry.follow import follow
from ground.registry.redis import RedisRegistry
from ground.registry.types import Change, WorkerStatus
from placement.applocks import AppLocks
from placement.fleet import republish
from placement.fleet.fleetindex import FleetIndex
from placement.fleet.republish import Republisher
from placement.store.factory import open_store
from tests.support.redis_server import start_redis_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def test_a_redis_restarted_empty_is_republished_on_the_feeds_reconnect_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(republish, "SAFETY_CHECK_S", 3600.0)
    opened = await open_store("sqlite", tmp_path)
    stored = await opened.apps.create(AppConfig(name="web", image="example/web:v1",
                                                regions=["local"]))

    async def nothing(_: Change | None = None) -> None:
        return None

    with start_redis_server() as server:
        registry = RedisRegistry(server.url, timeout_s=0.5)
        republisher = Republisher(registry, opened.apps, AppLocks(), 1.0)
        # what the fleet index does in placement: a read blocked on the feed, always
        feed = asyncio.create_task(follow(registry, SimpleNamespace(position=None), nothing,
                                          nothing, "test feed"))
        assert await republisher.check() == 1  # the first publish
        first = await registry.generation()
        republisher.start()
        await asyncio.sleep(0.2)  # its loop waits now, for a sign (no timer in play)
    try:  # Redis was killed; now it comes back at the same address, empty
        with start_redis_server(port=server.port):
            copy = await _republished(registry, "web")
            assert copy.uid == stored.uid
            assert republisher.watch.known == await registry.generation() != first
    finally:
        feed.cancel()
        await republisher.close()
        await registry.close()
        await opened.close()


async def test_a_flush_is_republished_when_a_workers_heartbeat_names_the_new_generation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(republish, "SAFETY_CHECK_S", 3600.0)
    # and connections made meanwhile (the pool may grow) out of play too: the heartbeat
    # alone must tell
    monkeypatch.setattr(RedisRegistry, "on_connect", lambda self, callback: None)
    opened = await open_store("sqlite", tmp_path)
    await opened.apps.create(AppConfig(name="web", image="example/web:v1", regions=["local"]))
    with start_redis_server() as server:
        registry = RedisRegistry(server.url, timeout_s=0.5)
        republisher = Republisher(registry, opened.apps, AppLocks(), 1.0)
        index = FleetIndex(registry, hold_s=3.0, flush_interval_s=0.01)
        index.on_worker = republisher.heard
        try:
            await index.start()
            assert await republisher.check() == 1
            republisher.start()
            await asyncio.sleep(0.2)  # its loop waits now, for a sign
            await registry._r.flushall()  # connections kept: no reconnect to hear
            assert await registry.app("web") is None
            status = worker("w1")
            # the agent hears the new generation in its heartbeat's answer, publishes what
            # it has again, then heartbeats naming it
            heard = await registry.publish_worker(status, ttl_s=5)
            await registry.publish_worker(msgspec.structs.replace(status, generation=heard),
                                          ttl_s=5)
            await _republished(registry, "web")
            assert republisher.watch.known == heard
        finally:
            await index.stop()
            await republisher.close()
            await registry.close()
            await opened.close()


async def test_a_worker_heard_in_the_feed_is_awaited_after_a_loss_without_any_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whom a loss waits for is learnt from the heartbeats the feed brings, not from a
    look every few seconds: a worker heard once before a loss is awaited (a second
    machine was made for an app whose worker had not been looked at yet: its machine
    was not back in the view when the reconciler acted)."""
    monkeypatch.setattr(republish, "SAFETY_CHECK_S", 3600.0)
    opened = await open_store("sqlite", tmp_path)
    with start_redis_server() as server:
        registry = RedisRegistry(server.url, timeout_s=0.5)
        republisher = Republisher(registry, opened.apps, AppLocks(), 30.0)
        try:
            await republisher.check()
            republisher.heard(worker("w1"))
            republisher.heard(worker("w2", draining=True))
            await registry._r.flushall()
            assert not await republisher.trusted()  # the refill waits for w1's heartbeat
            assert republisher.refill is not None
            assert republisher.refill.awaited == frozenset({"w1"})
        finally:
            await republisher.close()
            await registry.close()
            await opened.close()


def worker(worker_id: str, draining: bool = False) -> WorkerStatus:
    return WorkerStatus(id=worker_id, epoch=1, region="local", url=f"http://{worker_id}",
                        cpus=1, memory_mb=1, draining=draining)


async def _republished(registry: RedisRegistry, name: str, within_s: float = 20) -> AppConfig:
    """The app's copy in the registry, once placement has published it again."""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        try:
            copy = await registry.app(name)
        except Exception:  # (the registry between its stop and its start)
            copy = None
        if copy is not None:
            return copy
        assert asyncio.get_running_loop().time() < deadline, "never republished"
        await asyncio.sleep(0.05)


async def test_wakes_asking_at_once_share_one_read_of_the_generation(tmp_path: Path) -> None:
    """Each wake asks whether the registry's view may be acted on; a herd asking at once
    is answered by the check under way and one more, whose read follows every call it
    answers (one that may predate a call could have missed a loss), not once each."""
    from ground.registry.memory import MemoryRegistry

    class Counted(MemoryRegistry):
        reads = 0

        async def generation(self) -> str:
            self.reads += 1
            await asyncio.sleep(0.01)  # a round trip
            return await super().generation()

    opened = await open_store("sqlite", tmp_path)
    registry = Counted()
    republisher = Republisher(registry, opened.apps, AppLocks(), 1.0)
    try:
        assert await republisher.check() == 0  # the first: nothing stored to publish
        registry.reads = 0
        loop = asyncio.get_running_loop()
        answers = await asyncio.gather(*(republisher.wait_trusted(loop.time() + 5)
                                         for _ in range(50)))
        assert answers == [True] * 50 and registry.reads == 2
        # a caller given up (its deadline) while waiting leaves the check to the others
        slow = asyncio.ensure_future(republisher.check())
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.001):
                await republisher.check()
        assert await slow == 0
    finally:
        await republisher.close()
        await opened.close()


async def test_a_check_asked_while_one_runs_reads_the_generation_after_it_was_asked(
    tmp_path: Path,
) -> None:
    """A loss between the read of a check under way and a later call is seen by that
    call: it is not answered by the check that read before it."""
    from ground.registry.memory import MemoryRegistry

    class Slow(MemoryRegistry):
        async def generation(self) -> str:
            now = self._generation  # read at the call, answered a round trip later
            await asyncio.sleep(0.05)
            return now

    opened = await open_store("sqlite", tmp_path)
    registry = Slow()
    republisher = Republisher(registry, opened.apps, AppLocks(), 1.0)
    try:
        await republisher.check()
        before = republisher.watch.known
        running = asyncio.ensure_future(republisher.check())
        await asyncio.sleep(0.01)  # its read is made
        registry._generation = "lost-and-made-again"
        await republisher.check()
        await running
        assert republisher.watch.known == "lost-and-made-again" != before
    finally:
        await republisher.close()
        await opened.close()
