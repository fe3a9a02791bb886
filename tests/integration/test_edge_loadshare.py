"""Two edges on one registry and one load board: a machine's limits count the requests
both send it, and each edge's demand is where placement reads it (edge/loadshare.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest

from edge.loadshare import MemoryLoadBoard
from ground.registry.memory import MemoryRegistry
from tests.support.edge_fakes import EdgeHarness, start_edge

pytestmark = pytest.mark.integration

APP = {"name": "web", "auto_start": False, "hold_timeout_s": 20,
       "concurrency": {"soft_limit": 1, "hard_limit": 2}}


@contextlib.asynccontextmanager
async def two_edges(board: MemoryLoadBoard) -> AsyncIterator[tuple[EdgeHarness, EdgeHarness]]:
    """Edge a serving `web` from one machine and edge b with no app of its own, on one
    registry and `board`, each with the machine in its view."""
    registry = MemoryRegistry()
    a = await start_edge([APP], registry=registry, board=board, load_share_interval_s=0.05)
    b = await start_edge([], registry=registry, board=board, load_share_interval_s=0.05)
    try:
        await a.add_machine("web", "web-m1")
        for harness in (a, b):
            await until(harness, lambda s: bool(s["apps"].get("web", {}).get("machines")))
        yield a, b
    finally:
        await a.close()
        await b.close()


@pytest.fixture
async def edges() -> AsyncIterator[tuple[EdgeHarness, EdgeHarness, MemoryLoadBoard]]:
    board = MemoryLoadBoard()
    async with two_edges(board) as (a, b):
        yield a, b, board


async def until(harness: EdgeHarness, ok, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not ok(await harness.state()):
        assert time.monotonic() < deadline, await harness.state()
        await asyncio.sleep(0.02)


async def soon(ok: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.02)


async def get(port: int, path: str) -> tuple[int, float]:
    async with aiohttp.ClientSession() as session, session.get(
            f"http://127.0.0.1:{port}{path}", headers={"Host": "web.localhost"}) as response:
        await response.read()
        return response.status, time.monotonic()


def machine(state: dict, app: str = "web") -> dict:  # type: ignore[type-arg]
    return state["apps"][app]["machines"][0]  # type: ignore[no-any-return]


async def test_a_machine_full_from_one_edge_holds_the_other_edges_requests_until_room(
    edges: tuple[EdgeHarness, EdgeHarness, MemoryLoadBoard],
) -> None:
    a, b, board = edges
    busy = [asyncio.create_task(get(a.port, "/sleep?ms=1500")) for _ in range(2)]
    await until(a, lambda s: machine(s)["in_flight"] == 2)
    await until(b, lambda s: machine(s)["in_flight"] == 2)  # a's two, seen from b
    await soon(lambda: board.demand("web") == 2)  # a's, where placement reads edges' demand
    late = asyncio.create_task(get(b.port, "/sleep?ms=10"))
    await until(b, lambda s: s["apps"]["web"]["held"] == 1)  # hard_limit 2: held, not sent
    assert (await b.state())["apps"]["web"]["in_flight"] == 0  # b's own: none yet
    await soon(lambda: board.demand("web") == 3)  # a's 2 in flight + b's 1 held
    done = await asyncio.gather(*busy)
    status, finished = await late
    assert [s for s, _ in done] == [200, 200] and status == 200
    assert finished > max(t for _, t in done)  # served once a's requests made room
    await until(b, lambda s: machine(s)["in_flight"] == 0 and s["apps"]["web"]["held"] == 0)
    await until(a, lambda s: machine(s)["in_flight"] == 0)
    await soon(lambda: board.demand("web") == 0)


async def test_an_edge_that_stops_sharing_stops_counting_within_its_entries_ttl(
    edges: tuple[EdgeHarness, EdgeHarness, MemoryLoadBoard],
) -> None:
    a, b, _ = edges
    busy = asyncio.create_task(get(a.port, "/sleep?ms=3000"))
    await until(b, lambda s: machine(s)["in_flight"] == 1)
    await a.runtime.load_share.close()  # type: ignore[attr-defined]  # a stops publishing
    await until(b, lambda s: machine(s)["in_flight"] == 0, timeout_s=2)
    assert (await busy)[0] == 200


async def test_an_edge_does_not_stop_a_machine_another_edge_keeps_busy() -> None:
    registry = MemoryRegistry()
    board = MemoryLoadBoard()
    idle = {**APP, "auto_stop": "stop", "idle_timeout_s": 0.5}
    a = await start_edge([idle], registry=registry, board=board, load_share_interval_s=0.05)
    b = await start_edge([], registry=registry, board=board, load_share_interval_s=0.05,
                         autostop_interval_s=0.1)
    try:
        await a.add_machine("web", "web-m1")
        await until(b, lambda s: bool(s["apps"].get("web", {}).get("machines")))
        busy = asyncio.create_task(get(a.port, "/sleep?ms=2000"))
        await until(b, lambda s: machine(s)["elsewhere"] == 1)
        assert (await busy)[0] == 200  # b never asked to stop it meanwhile
        assert b.placement.autostops == []
        # idle everywhere now: b asks to stop it once its idle time has passed
        await soon(lambda: b.placement.autostops == ["web-m1"] or
                   a.placement.autostops == ["web-m1"])
    finally:
        await a.close()
        await b.close()

