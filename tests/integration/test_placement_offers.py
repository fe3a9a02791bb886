"""The offer loop against real HTTP servers that play agents which decline."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from aiohttp import web

from ground.registry.types import WorkerStatus
from tests.support.placement_helpers import Platform, agent_view, eventually, pulled

pytestmark = pytest.mark.integration


class DecliningAgent:
    """Answers image pulls, declines every offer with 409 no_capacity, counts offers."""

    def __init__(self) -> None:
        self.offers: list[str] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application()
        app.add_routes([
            web.post("/v1/images/pull", self.pull),
            web.post("/v1/offers", self.offer),
            web.get("/v1/machines", self.machines),
            web.delete("/v1/machines/{id}", self.destroy),
        ])
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self.url

    async def pull(self, request: web.Request) -> web.Response:
        return web.json_response(pulled((await request.json())["ref"],
                                        {"sha256:" + "b" * 64: 1000}))

    async def offer(self, request: web.Request) -> web.Response:
        self.offers.append((await request.json())["key"])
        return web.json_response({"error": "no_capacity", "message": "full"}, status=409)

    async def machines(self, request: web.Request) -> web.Response:
        return web.json_response([])

    async def destroy(self, request: web.Request) -> web.Response:
        return web.json_response({"error": "not_found", "message": "none"}, status=404)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def test_three_declining_workers_end_in_no_capacity_and_a_fourth_is_never_offered(
    tmp_path: Path, hello_layout: str,
) -> None:
    fakes = [DecliningAgent() for _ in range(4)]
    async with Platform(tmp_path, agents=0) as p:
        try:
            for i, fake in enumerate(fakes):
                url = await fake.start()
                status = WorkerStatus(id=f"f{i}", epoch=1, region="local", url=url, cpus=4,
                                      memory_mb=4096, updated_at=time.time())
                await p.registry.publish_worker(status, ttl_s=60)
            await p.create_app(name="busy", image=hello_layout)
            status, body = await p.call("POST", "/v1/apps/busy/machines", {"start": True})
            assert status == 503 and body["error"] == "no_capacity", body
            offered = [fake for fake in fakes if fake.offers]
            assert len(offered) == 3 and all(len(f.offers) == 1 for f in offered)
            status, decisions = await p.call("GET", "/v1/apps/busy/placements")
            assert decisions[0]["outcome"] == "no_capacity"
            assert [o["reply"] for o in decisions[0]["offers"]] == ["no_capacity"] * 3
        finally:
            for fake in fakes:
                await fake.stop()


class SlowAcceptingAgent(DecliningAgent):
    """Accepts every offer, idempotently by key, but answers the first one too late."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.made: dict[str, str] = {}  # offer key -> machine id
        self.destroyed: list[str] = []

    async def offer(self, request: web.Request) -> web.Response:
        key = (await request.json())["key"]
        self.offers.append(key)
        first = key not in self.made
        machine_id = self.made.setdefault(key, f"m{len(self.made)}")
        if first:
            await asyncio.sleep(self.delay_s)  # accepted, but after the offer timed out
        return web.json_response(agent_view(machine_id, "slow", "created"),
                                 status=201 if first else 200)

    async def destroy(self, request: web.Request) -> web.Response:
        self.destroyed.append(request.match_info["id"])
        return web.json_response(agent_view(request.match_info["id"], "slow", "destroying"),
                                 status=202)


async def test_an_offer_that_times_out_is_released_if_the_slow_agent_accepted_it(
    tmp_path: Path, hello_layout: str,
) -> None:
    slow = SlowAcceptingAgent(delay_s=1.0)
    async with Platform(tmp_path, agents=0, offer_timeout_s=0.3) as p:
        try:
            url = await slow.start()
            await p.registry.publish_worker(
                WorkerStatus(id="slow", epoch=1, region="local", url=url, cpus=4,
                             memory_mb=4096, updated_at=time.time()), ttl_s=60)
            await p.create_app(name="busy", image=hello_layout)
            status, body = await p.call("POST", "/v1/apps/busy/machines", {"start": True})
            assert status == 503 and body["error"] == "no_capacity", body
            deadline = time.monotonic() + 10
            while slow.destroyed != ["m0"]:
                assert time.monotonic() < deadline, (slow.offers, slow.destroyed)
                await asyncio.sleep(0.05)
            assert len(set(slow.offers)) == 1  # the release re-sent the same key
        finally:
            await slow.stop()


async def test_a_machine_a_wake_placed_for_an_app_deleted_meanwhile_is_destroyed(
    tmp_path: Path, hello_layout: str,
) -> None:
    slow = SlowAcceptingAgent(delay_s=1.0)  # accepts, one second after the offer
    async with Platform(tmp_path, agents=0, offer_timeout_s=5.0) as p:
        try:
            url = await slow.start()
            await p.registry.publish_worker(
                WorkerStatus(id="slow", epoch=1, region="local", url=url, cpus=4,
                             memory_mb=4096, updated_at=time.time()), ttl_s=60)
            await p.create_app(name="gone", image=hello_layout)
            wake = asyncio.create_task(p.call("POST", "/internal/apps/gone/wake",
                                              {"count": 1, "deadline_ms": 10_000}))
            await eventually(lambda: _offered(slow))  # the offer is on its way
            status, deleted = await p.call("DELETE", "/v1/apps/gone")
            assert status == 200 and deleted["machines"] == []  # nothing was there yet
            status, body = await wake
            assert status == 503, body  # the machine it placed is not started...
            assert slow.destroyed == ["m0"]  # ...but destroyed at once
        finally:
            await slow.stop()


async def _offered(agent: DecliningAgent) -> bool:
    return bool(agent.offers)
