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

With several placements, reports and marks are shared (placement/fleet/failuresync.py):
`report` is given the reports other placements heard (`also`), and `adopt` takes a
mark another placement made, unless this one has seen the worker under a newer epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

MAX_TRACKED = 10_000  # workers with reports or marks kept (oldest dropped first)
ADOPT_MIN_S = 1.0  # a shared mark with less left than this is not adopted


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
        self.newest: dict[str, int] = {}  # worker -> the newest epoch it was seen under

    def failed(self, worker: str, epoch: int) -> Mark | None:
        """The mark of `worker` running under `epoch`, if it still holds (`epoch`, the
        worker's heartbeat's, is remembered: a mark of an older one is not adopted)."""
        if epoch > self.newest.get(worker, 0):
            self.newest[worker] = epoch
            _bound(self.newest)
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

    def report(self, worker: str, reporter: str, machine: str,
               also: Iterable[tuple[str, str]] = ()) -> bool:
        """Record a report; whether the reports within the window (this placement's, and
        `also`: (reporter, machine) pairs other placements heard in it) are independent
        evidence against the host: two reporters, about two machines (one machine that
        died is not its host)."""
        now = self.clock()
        seen = {key: at for key, at in self.reports.pop(worker, {}).items()
                if now - at <= self.window_s}
        seen[(reporter, machine)] = now
        self.reports[worker] = seen  # re-inserted: newest last
        _bound(self.reports)
        return independent({*seen, *also})

    def fail(self, worker: str, epoch: int, reason: str) -> bool:
        """Mark `worker` failed; True when it was not already."""
        fresh = self.failed(worker, epoch) is None
        if fresh:
            self.marks[worker] = Mark(epoch, self.clock() + self.failed_for_s, reason)
            _bound(self.marks)
        self.reports.pop(worker, None)
        return fresh

    def adopt(self, worker: str, epoch: int, remaining_s: float, reason: str) -> bool:
        """Take a mark another placement made (`remaining_s` left of it); True when the
        worker was not failed here. Ignored for an epoch older than one this placement
        has seen the worker under, and with less than `ADOPT_MIN_S` left (this
        placement's own mark, run out here a moment before the shared copy)."""
        if epoch < self.newest.get(worker, 0) or remaining_s < ADOPT_MIN_S:
            return False
        current = self.failed(worker, epoch)
        until = self.clock() + remaining_s
        if current is None or (epoch >= current.epoch and until > current.until):
            self.marks[worker] = Mark(epoch, until, reason)
            _bound(self.marks)
        return current is None


def independent(reports: Iterable[tuple[str, str]]) -> bool:
    """(reporter, machine) pairs that are evidence against the host, not one observer's
    network or one machine's death: two reporters and two machines."""
    pairs = list(reports)
    return len({r for r, _ in pairs}) >= 2 and len({m for _, m in pairs}) >= 2


def _bound(table: dict[str, T]) -> None:
    while len(table) > MAX_TRACKED:
        table.pop(next(iter(table)))
