"""The memory registry's change feed: a ring read by arithmetic, never scanned."""

from __future__ import annotations

import asyncio

from ground.registry import memory
from ground.registry.memory import MemoryRegistry
from ground.registry.types import WORKERS, Change


class CountingRing(list[Change | None]):
    """The feed's ring, counting the slots read."""

    reads = 0

    def __getitem__(self, index):  # type: ignore[no-untyped-def, override]
        CountingRing.reads += 1
        return super().__getitem__(index)

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise AssertionError("the feed was scanned")


async def test_a_reader_reads_one_slot_per_change_however_many_are_retained() -> None:
    registry = MemoryRegistry()
    for n in range(memory.FEED_LENGTH + 50):  # a full ring
        await registry.set_worker_layers(f"w{n}", {})
    registry._feeds[WORKERS].ring = CountingRing(registry._feeds[WORKERS].ring)
    feed = registry.changes(after=await registry.feed_position(WORKERS), feed=WORKERS)
    CountingRing.reads = 0
    for n in range(100):
        await registry.set_worker_layers(f"x{n}", {})
        change = await asyncio.wait_for(feed.__anext__(), 1)
        assert change.key == f"x{n}"
    assert CountingRing.reads == 100
    await feed.aclose()  # type: ignore[attr-defined]


async def test_a_reader_behind_the_oldest_kept_change_goes_on_from_the_oldest_kept() -> None:
    registry = MemoryRegistry()
    start = await registry.feed_position(WORKERS)
    for n in range(memory.FEED_LENGTH + 5):
        await registry.set_worker_layers(f"w{n}", {})
    feed = registry.changes(after=start, feed=WORKERS)
    first = await feed.__anext__()
    second = await feed.__anext__()
    assert (first.key, second.key) == ("w5", "w6")
    assert int(second.seq) == int(first.seq) + 1
    await feed.aclose()  # type: ignore[attr-defined]


async def test_changes_written_while_a_reader_is_busy_all_reach_it_in_order() -> None:
    registry = MemoryRegistry()
    feed = registry.changes(feed=WORKERS)
    waiting = asyncio.ensure_future(feed.__anext__())
    await asyncio.sleep(0)
    for n in range(3):
        await registry.set_worker_layers(f"w{n}", {})
    assert (await waiting).key == "w0"
    assert [(await feed.__anext__()).key for _ in range(2)] == ["w1", "w2"]
    await feed.aclose()  # type: ignore[attr-defined]


async def test_closing_leaves_a_waiting_reader_waiting_rather_than_spinning() -> None:
    registry = MemoryRegistry()
    feed = registry.changes(feed=WORKERS)
    waiting = asyncio.ensure_future(feed.__anext__())
    await asyncio.sleep(0)
    await registry.close()
    for _ in range(3):
        await asyncio.sleep(0)  # a reader spinning on a set event would never let us here
    assert not waiting.done()
    waiting.cancel()
