"""Held requests leave on events, not on a poll: a machine published in the registry
releases them at once, and their Server-Timing tells the truth about the wake."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from edge.service import Edge
from ground.registry.types import MachineEvent, MachineRecord
from tests.support.edge_fakes import (
    EdgeHarness,
    FakePlacement,
    exchange_raw,
    split_response,
    start_backend,
    start_edge,
    stop_process,
    wait_port_async,
)

pytestmark = pytest.mark.integration

GET = b"GET / HTTP/1.1\r\nHost: slow.localhost\r\nConnection: close\r\n\r\n"


def shell(edge: EdgeHarness) -> Edge:
    return edge.runtime.edge  # type: ignore[attr-defined,no-any-return]


async def held(edge: EdgeHarness, count: int) -> None:
    deadline = time.monotonic() + 10
    while shell(edge).wakes.held("slow") < count:
        assert time.monotonic() < deadline, "the request was never held"
        await asyncio.sleep(0.01)


async def publish(edge: EdgeHarness, machine_id: str, port: int, boot_s: float) -> None:
    now = time.time()
    await edge.registry.put_machine(MachineRecord(  # type: ignore[attr-defined]
        id=machine_id, app="slow", worker="w-test", region="local", state="started",
        image_digest="", created_at=now - boot_s, updated_at=now, address=f"127.0.0.1:{port}",
        events=[MachineEvent("created", now - boot_s - 0.01),
                MachineEvent("starting", now - boot_s), MachineEvent("started", now)],
    ))


def timing(headers: dict[str, str]) -> dict[str, float]:
    return {name: float(ms) for name, ms in
            re.findall(r"(\w+);dur=([\d.]+)", headers.get("server-timing", ""))}


async def test_a_machine_from_the_registry_releases_held_requests_with_no_timer_due() -> None:
    # placement takes 60 s to answer and the hold lasts 60 s: only the registry event
    # can release the request before then
    placement = FakePlacement(wake_delay_s=60.0)
    edge = await start_edge([{"name": "slow", "hold_timeout_s": 60}], placement)
    proc, port = start_backend("slow-feed")
    try:
        await wait_port_async(port)
        request = asyncio.create_task(exchange_raw(edge.port, GET, timeout_s=20))
        await held(edge, 1)
        # one timer armed, at the hold's deadline (no sweep, no poll)
        timers = shell(edge).cold._timers
        assert list(timers) == ["slow"]
        assert timers["slow"].when() - shell(edge).loop.time() > 50
        await asyncio.sleep(0.3)  # time for the wake to be "in flight" a while
        published = time.monotonic()
        await publish(edge, "slow-feed", port, boot_s=0.08)
        status, headers, body = split_response(await request)
        took_ms = (time.monotonic() - published) * 1000
        print(f"released {took_ms:.1f} ms after the machine was published")
        assert status == 200 and body == b"hello from slow-feed"
        assert placement.wakes == [1]  # the wake is still out, unanswered
        # the truth of this cold response: held ~300 ms, of which boot 80 ms (from the
        # worker's events) and the rest before it counted as place
        phases = timing(headers)
        assert phases["hold"] >= 300 and 79 <= phases["boot"] <= 81
        assert phases["place"] > 200 and phases["pull"] == 0
        assert not shell(edge).cold._timers  # nothing held: no timer left armed
    finally:
        await edge.close()
        await asyncio.to_thread(stop_process, proc)


async def test_requests_released_by_the_wake_answer_carry_its_timings() -> None:
    placement = FakePlacement()
    edge = await start_edge([{"name": "slow"}], placement)
    try:
        status, headers, _ = split_response(await exchange_raw(edge.port, GET))
        assert status == 200
        phases = timing(headers)
        assert phases["place"] == 1.0 and phases["boot"] > 0  # the fake's answer
    finally:
        await edge.close()
