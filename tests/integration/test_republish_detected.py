"""A lost registry is detected, not polled (placement/republish.py): with the safety
timer out of play and no pass or wake asking, a Redis restarted empty is noticed when
the change feed's connection is made again, and every stored app is published again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from placement import republish
from placement.applocks import AppLocks
from placement.republish import Republisher
from placement.store.factory import open_store
from tests.support.redis_server import start_redis_server
from thaw.appconfig import AppConfig
from thaw.registry.follow import follow
from thaw.registry.redis import RedisRegistry
from thaw.registry.types import Change

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
            deadline = asyncio.get_running_loop().time() + 20
            while (copy := await _copy(registry, "web")) is None:
                assert asyncio.get_running_loop().time() < deadline, "never republished"
                await asyncio.sleep(0.1)
            assert copy.uid == stored.uid
            assert republisher.watch.known == await registry.generation() != first
    finally:
        feed.cancel()
        await republisher.close()
        await registry.close()
        await opened.close()


async def _copy(registry: RedisRegistry, name: str) -> AppConfig | None:
    try:
        return await registry.app(name)
    except Exception:  # (the registry between its stop and its start)
        return None
