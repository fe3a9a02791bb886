"""A registry flushed under a running platform: placement publishes every app again and
the agents their workers, layers and machines, within seconds, with nothing restarted,
and placement marks the generation republished once every worker said so; the
reconciler, meanwhile, neither creates nor destroys a machine."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from ground.registry.redis import RedisRegistry
from tests.support.placement_helpers import Platform, eventually, hello_layout  # noqa: F401
from tests.support.redis_server import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_a_flushed_registry_is_filled_again_and_no_machine_is_made_or_lost(
    tmp_path: Path, hello_layout: str, redis_own: RedisServer  # noqa: F811
) -> None:
    registry = RedisRegistry(redis_own.url)
    async with Platform(tmp_path, agents=2, registry=registry) as p:
        await p.create_app(name="hello", image=hello_layout, min_machines_running=1, spares=1,
                           guest={"cpus": 0.25, "memory_mb": 64})

        async def shaped() -> bool:  # both machines made, and the events saying so written
            _, found = await p.call("GET", "/v1/apps/hello/machines")
            if sorted(m["state"] for m in found) != ["created", "started"]:
                return False
            _, events = await p.call("GET", "/v1/apps/hello/events")
            made = {e["machine"] for e in events if e["action"] == "create"}
            return {m["id"] for m in found} <= made

        await eventually(shaped, timeout_s=30)
        _, before = await p.call("GET", "/v1/apps/hello/machines")
        _, events_before = await p.call("GET", "/v1/apps/hello/events")
        generation = await registry.generation()

        raw = aioredis.Redis.from_url(redis_own.url)
        await raw.flushall()
        await raw.aclose()
        flushed_at = asyncio.get_running_loop().time()
        assert p.placement.placement is not None
        # a pass right then (as its timer could fire) sees no worker alive: it must wait
        await p.placement.placement.reconciler.pass_now("hello")

        async def republished() -> bool:
            app = await registry.app("hello")
            records = await registry.machines("hello")
            workers = await registry.workers()
            holders = [await registry.layer_holders(d) for w in workers for d in w.layers]
            return (app is not None and app.release == 1
                    and {r.id for r in records} == {m["id"] for m in before}
                    and len(workers) == 2 and all(holders) and len(holders) > 0)

        await eventually(republished, timeout_s=5)
        assert await registry.generation() != generation

        async def marked() -> bool:  # once both workers said they published again
            return await registry.republished() == await registry.generation()

        await eventually(marked, timeout_s=10)
        workers = await registry.workers()
        assert {w.generation for w in workers} == {await registry.generation()}
        # past the reconciler's grace and a timer pass: the shape was never in doubt
        await asyncio.sleep(max(0.0, flushed_at + 8 - asyncio.get_running_loop().time()))
        _, after = await p.call("GET", "/v1/apps/hello/machines")
        assert {(m["id"], m["state"]) for m in after} == {(m["id"], m["state"]) for m in before}
        _, events_after = await p.call("GET", "/v1/apps/hello/events")
        assert len(events_after) == len(events_before), events_after
    await registry.close()
