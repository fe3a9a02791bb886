"""One contract for the edges' load board, on memory and on a real Redis: each edge sees
the others' loads summed, never its own; entries expire; demand lands where placement
reads the edges' demand."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as redis

from edge.adapters.loadboard import DEMAND_BATCH, NEWS_KEPT, RedisLoadBoard
from edge.loadshare import MemoryLoadBoard
from ground.registry import keys
from placement.adapters.coordination import RedisCoordination


class Backend:
    def __init__(self, board: Any, demand: Callable[[str], Awaitable[int]]) -> None:
        self.board, self.demand = board, demand


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "memory":
        board = MemoryLoadBoard()

        async def memory_demand(app: str) -> int:
            return board.demand(app)

        yield Backend(board, memory_demand)
        return
    url = await request.getfixturevalue("redis_server").flushed()
    redis_board = RedisLoadBoard(url)
    placement = RedisCoordination(url)

    async def placement_reads(app: str) -> int:  # as a wake's sizing reads it
        return await placement.report(app, "a-placement-probe", 0, 1.0)

    yield Backend(redis_board, placement_reads)
    await redis_board.close()
    await placement.close()


async def test_each_edge_sees_the_others_loads_summed_never_its_own(backend: Backend) -> None:
    board = backend.board
    assert await board.share("e1", {"web": {"m1": 2}}, {}, 1.0) == {}
    assert await board.share("e2", {"web": {"m1": 1, "m2": 3}, "api": {"m9": 1}}, {},
                             1.0) == {"web": {"m1": 2}}
    assert await board.share("e3", {}, {}, 1.0) == {
        "web": {"m1": 3, "m2": 3}, "api": {"m9": 1}}
    assert await board.share("e1", {}, {}, 1.0) == {  # e1's own withdrawn: not counted
        "web": {"m1": 1, "m2": 3}, "api": {"m9": 1}}
    assert await board.share("e2", {}, {}, 1.0) == {}


async def test_an_edge_that_stops_sharing_stops_counting_when_its_entry_expires(
    backend: Backend,
) -> None:
    board = backend.board
    await board.share("e1", {"web": {"m1": 2}}, {}, 0.2)
    assert await board.share("e2", {}, {}, 0.2) == {"web": {"m1": 2}}
    await asyncio.sleep(0.3)
    assert await board.share("e2", {}, {}, 0.2) == {}


async def test_demand_is_per_edge_summed_withdrawn_at_zero_and_expires(
    backend: Backend,
) -> None:
    board = backend.board
    await board.share("e1", {}, {"web": 3, "api": 1}, 0.3)
    await board.share("e2", {}, {"web": 2}, 5.0)
    assert await backend.demand("web") == 5 and await backend.demand("api") == 1
    await board.share("e2", {}, {"web": 0}, 5.0)  # idle now: withdrawn
    assert await backend.demand("web") == 3
    await asyncio.sleep(0.4)  # e1 stopped sharing
    assert await backend.demand("web") == 0 and await backend.demand("api") == 0


async def test_a_report_writes_the_edges_demand_and_reads_every_edges_in_one_step(
    backend: Backend,
) -> None:
    """What an edge's own thaw asks before it answers a wake: its demand written, the sum
    read back (its own counted once, the others' as shared or reported, expired ones not),
    the same figure placement's sizing reads."""
    board = backend.board
    assert await board.report("e1", "web", 4, 5.0) == 4
    assert await board.report("e1", "web", 6, 5.0) == 6  # replaced, not added
    await board.share("e2", {}, {"web": 3}, 0.3)
    assert await board.report("e3", "web", 2, 5.0) == 11
    assert await backend.demand("web") == 11
    await asyncio.sleep(0.4)  # e2 stopped sharing
    assert await board.report("e3", "web", 0, 5.0) == 6  # withdrawn at 0
    assert await board.report("e1", "api", 1, 5.0) == 1  # per app


async def test_the_demand_of_more_apps_than_one_batch_all_lands(backend: Backend) -> None:
    apps = {f"app{i:03d}": i + 1 for i in range(DEMAND_BATCH + 44)}
    await backend.board.share("e1", {}, apps, 5.0)
    for app in ("app000", f"app{DEMAND_BATCH:03d}", f"app{DEMAND_BATCH + 43:03d}"):
        assert await backend.demand(app) == apps[app]


async def test_news_is_read_from_a_position_and_a_blocked_read_returns_with_it(
    backend: Backend,
) -> None:
    board = backend.board
    await board.share("e1", {"web": {"m1": 1}}, {}, 5.0, news=True)  # e1's loads begin
    start = await board.news("", 0)  # the position now, at once
    assert await board.news(start, 0.1) == start  # nothing new: the block runs out
    await board.share("e1", {"web": {"m1": 2}}, {}, 5.0)  # e1 again, no news asked for
    await board.share("e1", {}, {}, 5.0, news=True)  # no loads: never news
    assert await board.news(start, 0.1) == start
    await board.share("e1", {"web": {"m1": 1}}, {}, 5.0)
    start = await board.news("", 0)  # (its loads back after none: news, unasked)
    waiting = asyncio.ensure_future(board.news(start, 10.0))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await board.share("e2", {"web": {"m2": 1}}, {}, 5.0, news=True)
    newer = await asyncio.wait_for(waiting, 5.0)  # at once, not after the block
    assert newer != start
    # the loads were there before the news could be read
    assert await board.share("e3", {}, {}, 5.0) == {"web": {"m1": 1, "m2": 1}}
    assert await board.news("", 0) == newer
    await board.share("e2", {"web": {"m2": 1, "m3": 1}}, {}, 5.0, news=True)
    await board.share("e2", {"web": {"m2": 1, "m4": 1}}, {}, 5.0, news=True)
    newest = await board.news(newer, 1.0)  # two news at once: the newest's position
    assert newest not in (start, newer) and await board.news(newest, 0.05) == newest


async def test_loads_shared_again_after_the_entry_lapsed_are_news_even_unasked(
    backend: Backend,
) -> None:
    """An edge stalled past its TTL (or a board that lost its entries) shares the machine
    it last shared: the others last read none of it, so it is news all the same."""
    board = backend.board
    await board.share("e1", {"web": {"m1": 1}}, {}, 0.2, news=True)
    start = await board.news("", 0)
    await board.share("e1", {"web": {"m1": 2}}, {}, 0.2)  # its entry alive: not news
    assert await board.news(start, 0.05) == start
    await asyncio.sleep(0.3)  # lapsed
    await board.share("e1", {"web": {"m1": 2}}, {}, 0.2)  # not asked, but news
    assert await board.news(start, 1.0) != start


async def test_the_news_stream_in_redis_stays_bounded(redis_server: Any) -> None:
    url = await redis_server.flushed()
    board = RedisLoadBoard(url)
    raw = redis.Redis.from_url(url)
    try:
        for _ in range(NEWS_KEPT * 5):
            await board.share("e1", {"web": {"m1": 1}}, {}, 5.0, news=True)
        assert await raw.xlen(keys.machine_load_news()) <= 3 * NEWS_KEPT
    finally:
        await board.close()
        await raw.aclose()


async def test_a_damaged_load_entry_in_redis_is_dropped_not_fatal(redis_server: Any) -> None:
    """Only Redis holds values of another form: a script failing on one would leave every
    edge counting alone for as long as any edge keeps the key alive."""
    url = await redis_server.flushed()
    raw = redis.Redis.from_url(url)
    await raw.hset(keys.machine_load(), "old-edge", "not an entry")
    await raw.hset(keys.machine_load(), "odd-edge", "99999999999999 [1, 2]")
    await raw.aclose()
    board = RedisLoadBoard(url)
    try:
        await board.share("e1", {"web": {"m1": 1}}, {}, 5.0)
        assert await board.share("e2", {}, {}, 5.0) == {"web": {"m1": 1}}
    finally:
        await board.close()
