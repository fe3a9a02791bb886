"""Worker failure marks and edges' reports, shared by every placement on one Redis.

An edge reports a worker as suspect to the placement it asks; with several placements,
each would judge alone: two edges' reports about two machines reaching two placements
would confirm nothing, and a worker one placement marked failed would still be offered
machines, woken on and reconciled onto by the others. So reports go into a book every
placement adds to and reads within the window, and a mark made by one is published;
every placement reads the standing marks every `poll_s` into its own `WorkerFailures`
(placement/core/failures.py, which decides), and pokes its reconciler when a worker is
newly failed there. Times are the book's own clock (Redis's `TIME`): placements on hosts
whose clocks differ agree on expiry. The book away (Redis down) leaves each placement
judging alone, as with one; nothing waits on it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from ground.periodic import Periodic
from placement.core.failures import WorkerFailures
from placement.errors import PlacementError
from placement.ports.failures import FailureBook

log = logging.getLogger("thaw.placement")

POLL_S = 0.5


class FailureSync:
    """This placement's `WorkerFailures`, with what other placements heard and marked."""

    def __init__(self, failures: WorkerFailures, book: FailureBook | None,
                 poll_s: float = POLL_S) -> None:
        self.failures = failures
        self.book = book
        self.poll_s = poll_s
        self._unshared: set[str] = set()  # workers marked here while the book was away
        self._rounds: Periodic | None = None

    async def report(self, worker: str, epoch: int, reporter: str, machine: str) -> bool:
        """An edge's report about `worker` (under `epoch`); whether the reports, every
        placement's, now confirm it."""
        heard: list[tuple[str, str]] = []
        if self.book is not None:
            try:
                heard = await self.book.suspect(worker, epoch, reporter, machine,
                                                self.failures.window_s)
            except PlacementError as exc:
                log.warning("failure reports not shared (judged alone): %s", exc.message)
        return self.failures.report(worker, reporter, machine, also=heard)

    async def fail(self, worker: str, epoch: int, reason: str) -> bool:
        """Mark the worker failed here and for every placement; True when it is news here."""
        fresh = self.failures.fail(worker, epoch, reason)
        if fresh and self.book is not None:
            try:
                await self.book.mark_failed(worker, epoch, reason, self.failures.failed_for_s)
            except PlacementError as exc:
                log.warning("worker %s's failure not shared yet: %s", worker, exc.message)
                self._unshared.add(worker)
        return fresh

    async def adopt(self) -> list[str]:
        """Share the marks made here while the book was away (for the time they have
        left), then read the standing marks once; the workers newly failed here."""
        if self.book is None:
            return []
        for worker in sorted(self._unshared):
            mark = self.failures.marks.get(worker)
            if mark is not None and (left := mark.until - self.failures.clock()) > 0:
                await self.book.mark_failed(worker, mark.epoch, mark.reason, left)
            self._unshared.discard(worker)
        return [mark.worker for mark in await self.book.failed_workers()
                if self.failures.adopt(mark.worker, mark.epoch, mark.remaining_s,
                                       mark.reason)]

    def start(self, newly_failed: Callable[[list[str]], Awaitable[None]]) -> None:
        """Poll the book (if any) every `poll_s`, telling `newly_failed` of new marks."""
        if self.book is None or self._rounds is not None:
            return

        lost: set[str] = set()  # adopted, their apps not looked at again yet

        async def poll() -> None:
            lost.update(await self.adopt())
            if lost:
                await newly_failed(sorted(lost))
                lost.clear()

        # (Redis or the store away): the next poll tries again
        self._rounds = Periodic("failure marks not followed", poll, self.poll_s, log)
        self._rounds.start()

    async def close(self) -> None:
        if self._rounds is not None:
            await self._rounds.close()
