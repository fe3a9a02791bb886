"""A task cancelled while it talks to Redis ends: the cancel is never consumed by the
client (ground/registry/redis.py, `CancelSafeRedis`: on Python 3.11 redis-py's
`asyncio.wait_for` around each send returned the send's result to a task cancelled in
the same turn and dropped the cancel, and a stop waiting for such a loop hung)."""

from __future__ import annotations

import asyncio
import random

import pytest

from ground.registry.redis import RedisRegistry
from tests.support.redis_server import RedisServer, redis_own  # noqa: F401

pytestmark = pytest.mark.integration


async def test_loops_on_the_registry_cancelled_at_any_point_all_end(
    redis_own: RedisServer,  # noqa: F811
) -> None:
    draw = random.Random(7)

    async def follow(registry: RedisRegistry) -> None:  # as feed followers: errors retried
        while True:
            try:
                async for _ in registry.changes(after="0-0"):
                    pass
            except Exception:
                await asyncio.sleep(0.01)

    async def write(registry: RedisRegistry) -> None:  # as a heartbeat: errors, go on
        while True:
            try:
                await registry.generation()
                await registry.feed_position()
            except Exception:
                pass
            await asyncio.sleep(draw.random() * 0.005)

    for round_ in range(30):
        registry = RedisRegistry(redis_own.url)
        tasks = [asyncio.create_task(follow(registry)) for _ in range(3)]
        tasks.append(asyncio.create_task(write(registry)))
        await asyncio.sleep(draw.random() * 0.2)
        if round_ % 2:
            await registry._r.flushall()  # the registry lost under them
            await asyncio.sleep(draw.random() * 0.02)
        for task in tasks:
            task.cancel()
        _, going_on = await asyncio.wait(tasks, timeout=3)
        assert not going_on, f"round {round_}: {going_on} went on after a cancel"
        await registry.close()
