"""/readyz of the edge and of an agent follows the registry: ready while Redis answers,
503 with a reason once it is gone (a real redis-server, killed by its PID)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.config import AgentConfig
from agent.runner import AgentRuntime
from edge.config import EdgeConfig
from edge.runner import EdgeRuntime
from ground.registry.redis import RedisRegistry
from tests.support.credentials import RING
from tests.support.redis_server import start_redis_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def readyz(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(f"{url}/readyz") as response:
        return response.status, await response.json()


async def until(check: Any, timeout_s: float = 15) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_the_edge_and_an_agent_are_ready_with_redis_and_not_once_it_is_gone(
    tmp_path: Path,
) -> None:
    with start_redis_server() as server:
        registry = RedisRegistry(server.url, timeout_s=0.5)
        agent = AgentRuntime(AgentConfig(state_dir=tmp_path / "agent", cluster_keys=RING,
                                         worker_id="w1", heartbeat_interval_s=0.2), registry)
        edge = EdgeRuntime(EdgeConfig(placement_url="http://127.0.0.1:9", port=0,
                                      cluster_keys=RING), registry)
        await agent.start()
        await edge.start()
        urls = [agent.url, f"http://127.0.0.1:{edge.admin_port}"]
        session = aiohttp.ClientSession()
        try:
            async def all_ready() -> bool:
                answers = [await readyz(session, url) for url in urls]
                return answers == [(200, {"ready": True})] * 2

            await until(all_ready)
        except BaseException:
            await session.close()
            await edge.stop()
            await agent.stop()
            raise
    try:  # the server is killed (SIGKILL, by its PID) when its context exits
        async def none_ready() -> bool:
            answers = [await readyz(session, url) for url in urls]
            return all(status == 503 for status, _ in answers)

        await until(none_ready)
        for url in urls:
            status, body = await readyz(session, url)
            assert status == 503 and body == {"ready": False,
                                              "reason": "the registry does not answer"}
    finally:
        await session.close()
        await edge.stop()
        await agent.stop()
        await registry.close()
