"""An idle edge does only the work time or a change asks for: its auto-stop passes come
when a machine may have become idle, its view's feed is one blocked read a long while,
and an unused edge's load share rests until another edge's load begins
(edge/housekeeping.py, edge/adapters/registry_feed.py, edge/loadshare.py). What that saves is
measured in loadtests/instr_idle.py."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from edge.adapters.loadboard import RedisLoadBoard
from ground.appconfig import parse
from ground.registry.redis import RedisRegistry
from tests.support.edge_fakes import start_edge
from tests.support.redis_server import RedisServer, redis_own  # noqa: F401

pytestmark = pytest.mark.integration


async def soon(ok, timeout_s: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not await ok():
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.02)


async def test_a_quiet_edge_passes_when_a_machine_may_be_idle_and_stops_it_on_time() -> None:
    harness = await start_edge([{"name": "web", "auto_stop": "stop", "idle_timeout_s": 2}],
                               autostop_interval_s=0.05)
    autostop = harness.shell.autostop
    passes: list[float] = []
    look = autostop.look
    autostop.look = lambda now: passes.append(now) or look(now)  # type: ignore[method-assign]
    try:
        began = time.monotonic()
        await harness.add_machine("web", "web-m1")

        async def stopped() -> bool:
            return harness.placement.autostops == ["web-m1"]

        await soon(stopped)
        assert time.monotonic() - began >= 2  # not before its idle time
        # an edge with a client would have passed every 0.05 s, forty times
        assert len(passes) <= 10, passes
    finally:
        await harness.close()


async def test_an_idle_edge_reads_the_feed_once_a_long_while_and_a_change_at_once(
    redis_own: RedisServer,  # noqa: F811
) -> None:
    registry = RedisRegistry(redis_own.url)
    board = RedisLoadBoard(redis_own.url)
    harness = await start_edge([{"name": "web"}], registry=registry, board=board,
                               load_share_interval_s=0.05)
    raw = aioredis.Redis.from_url(redis_own.url, decode_responses=True)
    try:
        await harness.add_machine("web", "web-m1")

        async def seen() -> bool:
            return bool((await harness.state())["apps"]["web"]["machines"])

        await soon(seen)
        await asyncio.sleep(0.3)  # what the start and the change asked for, done
        await raw.config_resetstat()
        await asyncio.sleep(3)  # three reads at the feed's old one-second block
        stats = await raw.info("commandstats")
        assert stats.get("cmdstat_xread", {}).get("calls", 0) <= 1, stats
        # a change still arrives at once: the blocked read returns with it
        await registry.put_app(parse({"name": "api", "image": "example/hello:v1"}))

        async def arrived() -> bool:
            return "api" in (await harness.state())["apps"]

        await soon(arrived, timeout_s=2)
    finally:
        await raw.aclose()
        await harness.close()
        await registry.close()


async def test_unused_edges_share_no_rounds_and_wake_when_another_edges_load_begins(
    redis_own: RedisServer,  # noqa: F811
) -> None:
    registry = RedisRegistry(redis_own.url)
    app = {"name": "web", "auto_start": False, "hold_timeout_s": 20,
           "concurrency": {"soft_limit": 1, "hard_limit": 2}}
    a = await start_edge([app], registry=registry, board=RedisLoadBoard(redis_own.url),
                         load_share_interval_s=0.05)
    b = await start_edge([], registry=registry, board=RedisLoadBoard(redis_own.url),
                         load_share_interval_s=0.05)
    raw = aioredis.Redis.from_url(redis_own.url, decode_responses=True)
    try:
        await a.add_machine("web", "web-m1")

        async def both_see_it() -> bool:
            states = [await h.state() for h in (a, b)]
            return all(s["apps"].get("web", {}).get("machines")  # type: ignore[attr-defined]
                       for s in states)

        await soon(both_see_it)
        await asyncio.sleep(0.5)  # the rounds the machine's arrival stirred, done
        await raw.config_resetstat()
        await asyncio.sleep(2)  # 80 rounds of two edges at 0.05 s; 20 at one a second
        stats = await raw.info("commandstats")
        assert stats.get("cmdstat_evalsha", {}).get("calls", 0) <= 2, stats

        # a's load begins: b, resting, reads it at once (not after its 30-s rest)
        busy = asyncio.create_task(_get(a.port, "/sleep?ms=1500"))

        async def seen_from_b() -> bool:
            machines = (await b.state())["apps"]["web"]["machines"]
            return bool(machines[0]["elsewhere"] == 1)  # type: ignore[index]

        await soon(seen_from_b, timeout_s=1.4)
        assert await busy == 200

        async def gone_from_b() -> bool:
            machines = (await b.state())["apps"]["web"]["machines"]
            return bool(machines[0]["elsewhere"] == 0)  # type: ignore[index]

        await soon(gone_from_b)
    finally:
        await raw.aclose()
        await a.close()
        await b.close()
        await registry.close()


async def _get(port: int, path: str) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: web.localhost\r\nConnection: close\r\n\r\n"
                 .encode())
    data = await reader.read()
    writer.close()
    return int(data.split(b" ", 2)[1])
