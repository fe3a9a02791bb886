"""The Redis backend when Redis dies: clear errors, no hang, recovery after restart."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from ground.registry import WorkerStatus
from ground.registry.redis import PoolWaits, RedisRegistry, RegistryUnavailable, WaitingPool
from tests.support.redis_server import start_redis_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


async def test_calls_fail_with_registry_unavailable_when_redis_is_killed() -> None:
    with start_redis_server() as server:
        registry = RedisRegistry(server.url, timeout_s=0.5)
        status = WorkerStatus(id="w1", epoch=1, region="local", url="http://w1",
                              cpus=1, memory_mb=1)
        await registry.publish_worker(status, ttl_s=5)
        assert [w.id for w in await registry.workers()] == ["w1"]
    # the server is killed (SIGKILL) when the context exits
    with pytest.raises(RegistryUnavailable):
        await registry.workers()
    with pytest.raises(RegistryUnavailable):
        await registry.publish_worker(status, ttl_s=5)
    await registry.close()


async def test_a_redis_flushed_or_restarted_empty_answers_a_new_generation() -> None:
    with start_redis_server() as server:
        registry = RedisRegistry(server.url, timeout_s=0.5)
        other = RedisRegistry(server.url, timeout_s=0.5)
        first = await registry.generation()
        assert await other.generation() == first  # one view, one name, whoever asks
        await registry._r.flushall()
        flushed = await other.generation()
        assert flushed != first and await registry.generation() == flushed
    with start_redis_server(port=server.port):  # the same address, empty
        restarted = await registry.generation()
        assert restarted not in (first, flushed)
        assert await other.generation() == restarted
    await registry.close()
    await other.close()


async def test_a_heartbeat_after_a_flush_names_the_new_generation_and_a_restart_is_heard(
) -> None:
    """The two ways a loss is noticed without a poll: a heartbeat's answer (a flush keeps
    the connections), and a connection made again (a restart)."""
    with start_redis_server() as server:
        registry = RedisRegistry(server.url, timeout_s=0.5)
        connects: list[int] = []
        registry.on_connect(lambda: connects.append(1))
        status = WorkerStatus(id="w1", epoch=1, region="local", url="http://w1",
                              cpus=1, memory_mb=1)
        first = await registry.publish_worker(status, ttl_s=5)
        assert connects and first == await registry.generation()
        await registry._r.flushall()
        flushed = await registry.publish_worker(status, ttl_s=5)
        assert flushed != first and flushed == await registry.generation()
        made = len(connects)
    with start_redis_server(port=server.port):
        restarted = await registry.publish_worker(status, ttl_s=5)  # retried, reconnected
        assert restarted not in (first, flushed) and len(connects) > made
    await registry.close()


async def test_a_redis_pool_run_dry_makes_callers_wait_and_counts_the_wait() -> None:
    with start_redis_server() as server:
        pool = WaitingPool.from_url(server.url, max_connections=1, timeout=10)
        client = aioredis.Redis.from_pool(pool)
        try:
            before = PoolWaits.count
            async def blpop() -> object:
                return await client.blpop(["thaw:test-empty"], timeout=0.5)

            blocked = asyncio.create_task(blpop())
            await asyncio.sleep(0.1)  # the only connection is blocked in BLPOP
            assert await client.ping()  # waited for it, then answered
            assert await blocked is None
            assert PoolWaits.count == before + 1
        finally:
            await client.aclose()
