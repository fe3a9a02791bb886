"""Placements share failure reports and marks through a book; the book away, each judges
alone and picks the marks up again when it is back (placement/fleet/failuresync.py)."""

from __future__ import annotations

import asyncio
import time

from placement.adapters.memory import MemoryFailureBook
from placement.core.failures import WorkerFailures
from placement.errors import Unavailable
from placement.fleet.failuresync import FailureSync
from placement.ports.failures import SharedMark


class Flaky(MemoryFailureBook):
    """A book that can be down (Redis away)."""

    down = False

    def _check(self) -> None:
        if self.down:
            raise Unavailable("redis: connection refused", code="registry_unavailable")

    async def suspect(self, worker: str, epoch: int, reporter: str, machine: str,
                      window_s: float) -> list[tuple[str, str]]:
        self._check()
        return await super().suspect(worker, epoch, reporter, machine, window_s)

    async def mark_failed(self, worker: str, epoch: int, reason: str, ttl_s: float) -> None:
        self._check()
        await super().mark_failed(worker, epoch, reason, ttl_s)

    async def failed_workers(self) -> list[SharedMark]:
        self._check()
        return await super().failed_workers()


async def test_the_book_away_each_placement_judges_alone_and_catches_up_after() -> None:
    book = Flaky()
    a = FailureSync(WorkerFailures(time.monotonic), book, poll_s=0.02)
    b = FailureSync(WorkerFailures(time.monotonic), book, poll_s=0.02)
    told: list[list[str]] = []
    adopted = asyncio.Event()

    async def lost(workers: list[str]) -> None:
        told.append(workers)
        adopted.set()

    a.start(lost)
    book.down = True
    assert await b.report("w1", 2, "edge-a", "m1") is False
    assert await b.report("w1", 2, "edge-b", "m2") is True  # its own reports still count
    assert await b.fail("w1", 2, "two edges") is True  # marked here, not shared
    await asyncio.sleep(0.1)  # a's polls fail meanwhile, and go on
    assert told == [] and a.failures.failed("w1", 2) is None
    book.down = False
    await b.fail("w2", 1, "its agent does not answer")  # shared now
    await asyncio.wait_for(adopted.wait(), 5)
    assert told == [["w2"]]
    assert a.failures.failed("w2", 1) is not None
    adopted.clear()
    assert await b.adopt() == []  # b's next poll shares what it marked while away
    await asyncio.wait_for(adopted.wait(), 5)
    await a.close()
    assert told == [["w2"], ["w1"]]
    mark = a.failures.failed("w1", 2)
    assert mark is not None and mark.reason == "two edges"


async def test_without_a_book_nothing_is_shared_and_nothing_polls() -> None:
    alone = FailureSync(WorkerFailures(time.monotonic), None)

    async def lost(workers: list[str]) -> None:
        raise AssertionError("no book: nothing to be told")

    alone.start(lost)
    assert await alone.adopt() == []
    assert await alone.report("w1", 1, "edge-a", "m1") is False
    assert await alone.fail("w1", 1, "x") is True
    await alone.close()
