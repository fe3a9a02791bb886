"""Which workers placement counts as failed beyond a lapsed heartbeat (pure: no IO).

An edge that cannot connect to a machine reports its worker as suspect. One report
is one observer's word (its own network may be at fault), and one machine refusing
connects may have died alone, so it needs a second, independent observation:
placement's own probe of the worker's agent failing (the shell probes on every
report), or reports from two edges about two machines of the worker within
`window_s`. A failed worker is not live for
anything placement does (wakes, placements, the reconciler, which fences its
machines) until it heartbeats under a new epoch (its agent restarted) or `failed_for_s`
passes: a worker whose heartbeat is still fresh then is trusted again, and the
machines fenced meanwhile are destroyed, never routed to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

MAX_TRACKED = 10_000  # workers with reports or marks kept (oldest dropped first)


@dataclass(frozen=True)
class Mark:
    epoch: int
    until: float
    reason: str


class WorkerFailures:
    def __init__(self, clock: Callable[[], float], *, window_s: float = 10.0,
                 failed_for_s: float = 30.0) -> None:
        self.clock = clock
        self.window_s = window_s
        self.failed_for_s = failed_for_s
        self.marks: dict[str, Mark] = {}
        self.reports: dict[str, dict[tuple[str, str], float]] = {}  # worker -> (reporter,
        # machine) -> when

    def failed(self, worker: str, epoch: int) -> Mark | None:
        """The mark of `worker` running under `epoch`, if it still holds."""
        mark = self.marks.get(worker)
        if mark is None:
            return None
        if epoch > mark.epoch or self.clock() >= mark.until:
            del self.marks[worker]
            return None
        return mark

    def standing(self) -> dict[str, int]:
        """Every worker with a mark that has not run out: worker -> the epoch it is for
        (a worker back under a newer epoch is not failed: see `failed`)."""
        now = self.clock()
        return {worker: mark.epoch for worker, mark in self.marks.items() if now < mark.until}

    def report(self, worker: str, reporter: str, machine: str) -> bool:
        """Record a report; whether the reports within the window are independent
        evidence against the host: two reporters, about two machines (one machine that
        died is not its host)."""
        now = self.clock()
        seen = {key: at for key, at in self.reports.pop(worker, {}).items()
                if now - at <= self.window_s}
        seen[(reporter, machine)] = now
        self.reports[worker] = seen  # re-inserted: newest last
        _bound(self.reports)
        return len({r for r, _ in seen}) >= 2 and len({m for _, m in seen}) >= 2

    def fail(self, worker: str, epoch: int, reason: str) -> bool:
        """Mark `worker` failed; True when it was not already."""
        fresh = self.failed(worker, epoch) is None
        if fresh:
            self.marks[worker] = Mark(epoch, self.clock() + self.failed_for_s, reason)
            _bound(self.marks)
        self.reports.pop(worker, None)
        return fresh


def _bound(table: dict[str, T]) -> None:
    while len(table) > MAX_TRACKED:
        table.pop(next(iter(table)))
