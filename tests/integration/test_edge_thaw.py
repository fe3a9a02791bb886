"""The edge's own thaw of a suspended machine (edge/adapters/thaw.py) with real sockets:
a fake agent answers the edge's signed start, a fake placement's wake runs beside it.
The thaw's machine serves the held request when its agent answers started (and, with
route keys, sealed); whatever else happens, the wake is the fallback."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from agent.api import EventView, Guest, MachineView
from edge.loadshare import MemoryLoadBoard
from ground.auth import tickets
from ground.auth.aiohttp_glue import refusal
from ground.auth.signing import Verifier
from ground.registry.types import MachineRecord, WorkerStatus
from tests.support.credentials import RING, ROUTE_KEYS
from tests.support.edge_fakes import (
    EdgeHarness,
    FakePlacement,
    serve_app,
    start_backend,
    start_edge,
    stop_process,
    wait_port_async,
)
from tests.support.ports import free_port

pytestmark = pytest.mark.integration

WORKER = "w-nap"
MACHINE = "nap-m7"


@dataclass
class FakeAgent:
    """Answers `POST /v1/machines/{id}/start` as an agent would for a thawed machine at
    `address` — or, per `mode`: "error" (500), "foreign" (another machine's view),
    "starting" (not started in time), "unsealed" (no route seal)."""

    address: str
    mode: str = "ok"
    seal_with: tickets.RouteKeys | None = None
    delay_s: float = 0.0  # before answering
    split: bool = False  # the answer's body in two writes, a moment apart
    starts: list[tuple[str, str]] = field(default_factory=list)  # (machine id, wait_s)
    journal: list[str] = field(default_factory=list)  # "answered", once per answer
    unsigned: int = 0
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.add_routes([web.post("/v1/machines/{id}/start", self._start)])
        self._runner, self.url = await serve_app(app)
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _start(self, request: web.Request) -> web.Response:
        if await refusal(Verifier(RING), request) is not None:
            self.unsigned += 1
            return web.Response(status=401)
        mid = request.match_info["id"]
        self.starts.append((mid, request.query.get("wait_s", "")))
        await asyncio.sleep(self.delay_s)
        if self.mode == "error":
            return web.json_response({"error": "internal"}, status=500)
        now = time.time()
        state = "starting" if self.mode == "starting" else "started"
        view = MachineView(
            id="nap-other" if self.mode == "foreign" else mid, app="nap", worker=WORKER,
            region="local", state=state, image_digest="", created_at=now - 60,
            updated_at=now, address=self.address if state == "started" else "",
            image="example/hello:v1", pid=4242, guest=Guest(),
            events=[EventView("starting", "start", now - 0.001),
                    EventView(state, "ready", now, "resumed")])
        if self.seal_with is not None and self.mode != "unsealed":
            ticket = tickets.ticket(self.seal_with, "", view.id, WORKER)
            view = msgspec.structs.replace(
                view, seal=tickets.seal(ticket, view.state, view.address, view.updated_at))
        body = msgspec.json.encode(view)
        self.journal.append("answered")
        if not self.split:
            return web.Response(body=body, content_type="application/json")
        answer = web.StreamResponse(headers={"Content-Type": "application/json"})
        answer.content_length = len(body)
        await answer.prepare(request)
        await answer.write(body[:100])
        await asyncio.sleep(0.05)  # as a network may deliver it: the edge reads it all
        await answer.write(body[100:])
        await answer.write_eof()
        return answer


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:
        yield client


@pytest.fixture
async def frozen_backend() -> AsyncIterator[str]:
    """The suspended machine's process (it runs: the agent's thaw is faked)."""
    proc, port = start_backend(MACHINE)
    try:
        await wait_port_async(port)
        yield f"127.0.0.1:{port}"
    finally:
        await asyncio.to_thread(stop_process, proc)


async def napping_edge(agent_url: str, state: str = "suspended", wake_delay_s: float = 3.0,
                       address: str = "", **config: Any) -> EdgeHarness:
    """An edge whose registry holds app `nap`'s one machine, `state` (at `address`), on a
    worker whose agent is at `agent_url`; placement's wakes answer after `wake_delay_s`."""
    edge = await start_edge([{"name": "nap"}], FakePlacement(wake_delay_s=wake_delay_s),
                            **config)
    now = time.time()
    record = MachineRecord(id=MACHINE, app="nap", worker=WORKER, region="local", state=state,
                           image_digest="", created_at=now - 60, updated_at=now,
                           address=address)
    if config.get("route_keys") is not None:
        ticket = tickets.ticket(ROUTE_KEYS, "", MACHINE, WORKER)
        record = msgspec.structs.replace(record, seal=tickets.seal_record(ticket, record))
    registry: Any = edge.registry
    await registry.publish_worker(WorkerStatus(id=WORKER, epoch=1, region="local",
                                               url=agent_url, cpus=4, memory_mb=4096), 60)
    await registry.put_machine(record)
    deadline = time.monotonic() + 5
    while MACHINE not in edge.shell.view.apps["nap"].resting:
        assert time.monotonic() < deadline, "the record never reached the edge's view"
        await asyncio.sleep(0.02)
    return edge


@contextlib.asynccontextmanager
async def edge_beside(agent: FakeAgent | str, **options: Any) -> AsyncIterator[EdgeHarness]:
    """`napping_edge` with `agent` (started here and stopped after, or a URL as is)."""
    url = agent if isinstance(agent, str) else await agent.start()
    try:
        edge = await napping_edge(url, **options)
        try:
            yield edge
        finally:
            await edge.close()
    finally:
        if not isinstance(agent, str):
            await agent.close()


async def get(session: aiohttp.ClientSession, edge: EdgeHarness) -> tuple[int, str]:
    async with session.get(f"http://127.0.0.1:{edge.port}/",
                           headers={"Host": "nap.localhost"}) as response:
        return response.status, await response.text()


def results(edge: EdgeHarness) -> dict[str, int]:
    thaw = edge.shell.cold.thaw
    assert thaw is not None
    return dict(thaw.results)


async def test_a_held_request_is_served_by_the_machine_its_agent_thawed_and_placement_rests(
    session: aiohttp.ClientSession, frozen_backend: str,
) -> None:
    """The wake beside the thaw asks for one machine, and the thaw brought it: the wake
    is answered by it (result `thawed`) and placement is never called."""
    agent = FakeAgent(frozen_backend)
    async with edge_beside(agent) as edge:
        edge.shell.cold.thaw_head_start_s = 10.0  # (a loaded host's thaw may take 50 ms)
        status, body = await get(session, edge)
        assert (status, body) == (200, f"hello from {MACHINE}")  # not the wake's machine
        assert agent.starts == [(MACHINE, "10.000")] and agent.unsigned == 0
        assert results(edge) == {"thawed": 1}
        assert await get(session, edge) == (200, f"hello from {MACHINE}")  # warm now
        async with session.get(f"http://127.0.0.1:{edge.admin_port}/metrics") as response:
            metrics = await response.text()
        assert 'thaw_edge_direct_thaws_total{result="thawed"} 1.0' in metrics
        assert 'thaw_edge_wakes_total{app="nap",result="thawed"} 1.0' in metrics
        assert edge.placement.wakes == [] and len(agent.starts) == 1


async def wake_results(edge: EdgeHarness, results: dict[str, int]) -> None:
    """Wait until the app's wakes ended with `results` (placement's or the thaw's)."""
    deadline = time.monotonic() + 10
    while edge.shell.view.apps["nap"].stats.wakes != results:
        assert time.monotonic() < deadline, edge.shell.view.apps["nap"].stats.wakes
        await asyncio.sleep(0.02)


async def test_with_other_edges_the_thaw_answers_the_wake_only_if_every_edges_demand_fits(
    session: aiohttp.ClientSession, frozen_backend: str,
) -> None:
    """With other edges (a load board), the edge reports its demand and reads every
    edge's as it would answer the wake: alone on the app, the thawed machine is enough;
    with another edge's 100 requests of it (soft limit 20), the wake goes to placement,
    which sizes it from every edge's demand, and the held request is still the thaw's."""
    board = MemoryLoadBoard()
    async with edge_beside(FakeAgent(frozen_backend), board=board) as edge:
        edge.shell.cold.thaw_head_start_s = 10.0
        assert await get(session, edge) == (200, f"hello from {MACHINE}")
        await wake_results(edge, {"thawed": 1})
        assert edge.placement.wakes == [] and board.demand("nap") >= 1
    board = MemoryLoadBoard()
    await board.share("another-edge", {}, {"nap": 100}, 60.0)
    async with edge_beside(FakeAgent(frozen_backend), board=board, wake_delay_s=0.2) as edge:
        edge.shell.cold.thaw_head_start_s = 10.0
        assert await get(session, edge) == (200, f"hello from {MACHINE}")
        await wake_results(edge, {"ok": 1})
        assert edge.placement.wakes == [1] and results(edge) == {"thawed": 1}


async def test_the_machines_connection_is_opened_while_its_agent_thaws_it() -> None:
    """A suspended machine's record says where it listens (its frozen app's socket: the
    kernel accepts), so the edge connects beside the thaw, and the released request goes
    on that connection: no connect waits for the agent's answer."""
    journal: list[str] = []

    async def machine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        journal.append("connected")
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while await reader.readuntil(b"\r\n\r\n"):
                journal.append("request")
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nthawed")
        writer.close()

    server = await asyncio.start_server(machine, "127.0.0.1", 0)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    agent = FakeAgent(address, delay_s=0.5, journal=journal)
    try:
        async with edge_beside(agent, address=address) as edge, aiohttp.ClientSession() as s:
            assert await get(s, edge) == (200, "thawed")
            assert journal == ["connected", "answered", "request"]
            assert results(edge) == {"thawed": 1}
    finally:
        server.close()
        await server.wait_closed()


async def test_an_answer_that_comes_in_pieces_is_read_whole(
    session: aiohttp.ClientSession, frozen_backend: str,
) -> None:
    async with edge_beside(FakeAgent(frozen_backend, split=True)) as edge:
        assert await get(session, edge) == (200, f"hello from {MACHINE}")
        assert results(edge) == {"thawed": 1}


async def test_a_wake_that_fails_while_the_thaw_is_under_way_leaves_the_request_to_the_thaw(
    session: aiohttp.ClientSession, frozen_backend: str,
) -> None:
    """Placement refuses at once (after the thaw's head start) while the agent is still
    thawing: the held request is not failed with the wake's code, the thaw serves it."""
    async with edge_beside(FakeAgent(frozen_backend, delay_s=0.5), wake_delay_s=0.0) as edge:
        edge.placement.wake_error = (503, "no_capacity")
        assert await get(session, edge) == (200, f"hello from {MACHINE}")
        assert results(edge) == {"thawed": 1} and edge.placement.wakes == [1]


@pytest.mark.parametrize(("mode", "result"), [("error", "refused"), ("starting", "refused"),
                                              ("foreign", "unsealed")])
async def test_an_agent_answer_the_edge_may_not_route_by_leaves_the_request_to_the_wake(
    session: aiohttp.ClientSession, frozen_backend: str, mode: str, result: str,
) -> None:
    agent = FakeAgent(frozen_backend, mode=mode)
    async with edge_beside(agent, wake_delay_s=0.2) as edge:
        assert await get(session, edge) == (200, "hello from nap-m1")  # the wake's machine
        assert len(agent.starts) == 1 and results(edge) == {result: 1}
        assert MACHINE not in edge.shell.view.apps["nap"].machines
        assert WORKER not in edge.shell.cold.thaw.urls  # type: ignore[union-attr]


async def test_an_agent_that_does_not_answer_leaves_the_request_to_the_wake(
    session: aiohttp.ClientSession,
) -> None:
    async with edge_beside(f"http://127.0.0.1:{free_port()}", wake_delay_s=0.2) as edge:
        assert await get(session, edge) == (200, "hello from nap-m1")
        assert results(edge) == {"unreachable": 1}
        assert WORKER not in edge.shell.cold.thaw.urls  # type: ignore[union-attr]


@pytest.mark.parametrize(("agent_seals", "served_by", "result"), [
    ({"mode": "unsealed", "seal_with": ROUTE_KEYS}, "nap-m1", "unsealed"),
    # sealed, but not with a ticket placement gave that worker
    ({"seal_with": tickets.RouteKeys.parse("k" * 40)}, "nap-m1", "unsealed"),
    ({"seal_with": ROUTE_KEYS}, MACHINE, "thawed"),
])
async def test_with_route_keys_only_a_sealed_answer_is_routed_by(
    session: aiohttp.ClientSession, frozen_backend: str, agent_seals: dict[str, Any],
    served_by: str, result: str,
) -> None:
    agent = FakeAgent(frozen_backend, **agent_seals)
    async with edge_beside(agent, wake_delay_s=0.2, route_keys=ROUTE_KEYS) as edge:
        assert await get(session, edge) == (200, f"hello from {served_by}")
        assert results(edge) == {result: 1}


@pytest.mark.parametrize("options", [{"state": "starting"}, {"direct_thaw": False}])
async def test_no_thaw_of_its_own_while_a_machine_of_the_app_is_starting_or_when_off(
    session: aiohttp.ClientSession, frozen_backend: str, options: dict[str, Any],
) -> None:
    """A starting machine is the wake's to wait for, as placement would."""
    agent = FakeAgent(frozen_backend)
    async with edge_beside(agent, wake_delay_s=0.2, **options) as edge:
        assert await get(session, edge) == (200, "hello from nap-m1")
        assert agent.starts == [] and not (edge.shell.cold.thaw and results(edge))
