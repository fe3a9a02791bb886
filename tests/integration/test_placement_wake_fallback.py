"""When a worker declines to start a machine of a wake (409 no_capacity: no room there
now), the wake places another elsewhere — within max_machines, and destroying a new
machine whose start was declined rather than leaving it behind."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web

from ground.auth import tickets
from ground.registry.types import MachineRecord, WorkerStatus
from tests.support.credentials import ROUTE_KEYS
from tests.support.placement_helpers import Platform, agent_view, pulled

pytestmark = pytest.mark.integration
HALF = {"cpus": 0.5, "memory_mb": 64}


async def wake(p: Platform, app: str, count: int = 1) -> tuple[int, dict[str, Any]]:
    status, body = await p.call("POST", f"/internal/apps/{app}/wake",
                                {"count": count, "deadline_ms": 20_000})
    return status, body


async def stopped_machine_on_a_full_worker(p: Platform, app: str, image: str) -> dict[str, Any]:
    """The app's one machine, woken, auto-stopped, and its worker then filled by another
    app's machines: that worker declines to start it again."""
    status, first = await wake(p, app)
    assert status == 200, first
    machine: dict[str, Any] = first["machines"][0]
    status, body = await p.call(
        "POST", f"/internal/apps/{app}/machines/{machine['id']}/autostop", {"idle_s": 60})
    assert status == 200, body
    status, body = await p.call(
        "GET", f"/v1/apps/{app}/machines/{machine['id']}/wait?state=stopped&timeout_s=10")
    assert status == 200, body
    full = next(a for a in p.agents if a.agent is not None
                and a.agent.worker_id == machine["worker"])
    for i in range(2):
        status, made = await p.call("POST", full.url + "/v1/offers", {
            "key": f"filler-{i}", "app": "filler", "image": image, "guest": HALF,
            "start": True})
        assert status == 201, made
    status, refused = await p.call("POST", f"{full.url}/v1/machines/{machine['id']}/start")
    assert (status, refused["error"]) == (409, "no_capacity")
    return machine


async def test_a_declined_stopped_machine_is_not_replaced_when_it_alone_fills_max_machines(
    tmp_path: Path, hello_layout: str
) -> None:
    async with Platform(tmp_path, agents=2, cpus=1) as p:
        await p.create_app(name="x", image=hello_layout, guest=HALF, max_machines=1)
        stopped = await stopped_machine_on_a_full_worker(p, "x", hello_layout)
        status, body = await wake(p, "x")
        assert (status, body["error"]) == (503, "no_capacity"), body
        assert "max_machines=1" in body["message"]
        status, machines = await p.call("GET", "/v1/apps/x/machines")
        assert [(m["id"], m["state"]) for m in machines] == [(stopped["id"], "stopped")]
        assert p.machine_count() == 3  # the stopped one and the two fillers: nothing new


async def test_a_declined_stopped_machine_is_replaced_elsewhere_when_max_machines_has_room(
    tmp_path: Path, hello_layout: str
) -> None:
    async with Platform(tmp_path, agents=2, cpus=1) as p:
        await p.create_app(name="x", image=hello_layout, guest=HALF, max_machines=2)
        stopped = await stopped_machine_on_a_full_worker(p, "x", hello_layout)
        status, body = await wake(p, "x")
        assert status == 200, body
        [new] = body["machines"]
        assert new["id"] != stopped["id"] and new["worker"] != stopped["worker"]
        status, machines = await p.call("GET", "/v1/apps/x/machines")
        assert {m["id"]: m["state"] for m in machines} == {
            stopped["id"]: "stopped", new["id"]: "started"}


class StartDecliningAgent:
    """A worker that takes offers and pulls, then declines every start (409 no_capacity,
    as an agent whose room was taken meanwhile), and records what it is asked."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.made: list[str] = []
        self.starts: list[str] = []
        self.destroyed: list[str] = []
        self.runner: web.AppRunner | None = None

    async def start(self, p: Platform, cpus: float) -> None:
        app = web.Application()
        app.add_routes([
            web.post("/v1/images/pull", self.pull),
            web.post("/v1/offers", self.offer),
            web.post("/v1/machines/{id}/start", self.start_machine),
            web.get("/v1/machines", self.machines),
            web.delete("/v1/machines/{id}", self.destroy),
        ])
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        await p.registry.publish_worker(
            WorkerStatus(id=self.worker_id, epoch=1, region="local", url=url, cpus=cpus,
                         memory_mb=1024, updated_at=time.time()), ttl_s=60)

    async def pull(self, request: web.Request) -> web.Response:
        return web.json_response(pulled((await request.json())["ref"], {}))

    async def offer(self, request: web.Request) -> web.Response:
        body = await request.json()
        machine_id = f"{self.worker_id}-m{len(self.made)}"
        self.made.append(machine_id)
        return web.json_response(agent_view(machine_id, self.worker_id, "created",
                                            body["app"], body.get("app_uid", "")), status=201)

    async def start_machine(self, request: web.Request) -> web.Response:
        self.starts.append(request.match_info["id"])
        return web.json_response({"error": "no_capacity", "message": "no room now"},
                                 status=409)

    async def machines(self, request: web.Request) -> web.Response:
        return web.json_response([])

    async def destroy(self, request: web.Request) -> web.Response:
        self.destroyed.append(request.match_info["id"])
        return web.json_response(agent_view(request.match_info["id"], self.worker_id,
                                            "destroying"), status=202)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def test_a_new_machine_whose_start_is_declined_is_destroyed_and_placed_on_another_worker(
    tmp_path: Path, hello_layout: str
) -> None:
    fake = StartDecliningAgent("f0")  # ranked first: a better fit, and "f0" < "w0"
    async with Platform(tmp_path, agents=1) as p:
        try:
            await fake.start(p, cpus=0.7)
            await p.create_app(name="x", image=hello_layout, guest=HALF)
            status, body = await wake(p, "x")
            assert status == 200, body
            assert [m["worker"] for m in body["machines"]] == ["w0"]
            assert fake.made == fake.starts == fake.destroyed == ["f0-m0"]
        finally:
            await fake.stop()


async def test_a_new_machine_is_placed_once_more_only_and_both_declined_are_destroyed(
    tmp_path: Path, hello_layout: str
) -> None:
    fakes = [StartDecliningAgent(f"f{i}") for i in range(3)]
    async with Platform(tmp_path, agents=0) as p:
        try:
            for fake in fakes:
                await fake.start(p, cpus=1)
            await p.create_app(name="x", image=hello_layout, guest=HALF)
            status, body = await wake(p, "x")
            assert (status, body["error"]) == (503, "no_capacity"), body
            assert [f.made for f in fakes] == [["f0-m0"], ["f1-m0"], []]
            assert [f.destroyed for f in fakes] == [["f0-m0"], ["f1-m0"], []]
        finally:
            for fake in fakes:
                await fake.stop()


class SlowFullAgent(StartDecliningAgent):
    """A full worker: declines offers at once, and starts one second after being asked."""

    async def offer(self, request: web.Request) -> web.Response:
        return web.json_response({"error": "no_capacity", "message": "full"}, status=409)

    async def start_machine(self, request: web.Request) -> web.Response:
        await asyncio.sleep(1.0)
        return await super().start_machine(request)


async def test_a_wake_counts_the_new_machines_it_placed_before_replacing_a_declined_one(
    tmp_path: Path, hello_layout: str
) -> None:
    """The plan restarts a stopped machine and places one new one (max_machines=2); the
    new one is placed before the restart is declined: no third machine replaces it."""
    full = SlowFullAgent("f0")
    async with Platform(tmp_path, agents=1) as p:
        try:
            await full.start(p, cpus=1)
            app = await p.create_app(name="x", image=hello_layout, guest=HALF, max_machines=2)
            now = time.time()
            record = MachineRecord(  # sealed as f0 would, placement having placed it there
                id="f0-stopped", app="x", worker="f0", region="local", state="stopped",
                image_digest="", created_at=now, updated_at=now, app_uid=app["uid"])
            ticket = tickets.ticket(ROUTE_KEYS, app["uid"], "f0-stopped", "f0")
            await p.registry.put_machine(msgspec.structs.replace(
                record, seal=tickets.seal_record(ticket, record)))
            status, body = await wake(p, "x", count=2)
            assert status == 200, body
            assert [m["worker"] for m in body["machines"]] == ["w0"]
            assert "max_machines=2" in body["shortfall"]
            assert full.starts == ["f0-stopped"]
            status, machines = await p.call("GET", "/v1/apps/x/machines")
            assert [m["worker"] for m in machines] == ["w0"]  # and nothing more placed
        finally:
            await full.stop()
