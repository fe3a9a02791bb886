"""The offer loop against real HTTP servers that play agents which decline."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from aiohttp import web

from tests.support.placement_helpers import Platform
from thaw.registry.types import WorkerStatus

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
        ])
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self.url

    async def pull(self, request: web.Request) -> web.Response:
        return web.json_response({"digest": "sha256:" + "a" * 64,
                                  "layers": [{"digest": "sha256:" + "b" * 64, "size": 1000}]})

    async def offer(self, request: web.Request) -> web.Response:
        self.offers.append((await request.json())["key"])
        return web.json_response({"error": "no_capacity", "message": "full"}, status=409)

    async def machines(self, request: web.Request) -> web.Response:
        return web.json_response([])

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def test_three_declining_workers_end_in_no_capacity_and_a_fourth_is_never_offered(
    tmp_path: Path,
) -> None:
    fakes = [DecliningAgent() for _ in range(4)]
    async with Platform(tmp_path, agents=0) as p:
        try:
            for i, fake in enumerate(fakes):
                url = await fake.start()
                status = WorkerStatus(id=f"f{i}", epoch=1, region="local", url=url, cpus=4,
                                      memory_mb=4096, updated_at=time.time())
                await p.registry.publish_worker(status, ttl_s=60)
            await p.create_app(name="busy", image="example.test/busy:v1")
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
