"""The failure book port: edges' reports about workers and the marks placements make,
shared by every placement (placement/fleet/failuresync.py says how they are used)."""

from __future__ import annotations

from typing import NamedTuple, Protocol

MAX_REPORTS = 256  # (reporter, machine) pairs kept per worker within the window


class SharedMark(NamedTuple):
    worker: str
    epoch: int
    remaining_s: float
    reason: str


class FailureBook(Protocol):
    """Where placements share edges' reports and the marks they make."""

    async def suspect(self, worker: str, epoch: int, reporter: str, machine: str,
                      window_s: float) -> list[tuple[str, str]]:
        """Add a report about `worker` running under `epoch`; every (reporter, machine)
        pair reported of that incarnation within `window_s` (a worker back under a new
        epoch starts with none)."""
        ...

    async def mark_failed(self, worker: str, epoch: int, reason: str, ttl_s: float) -> None:
        """Publish a mark for `ttl_s` (a standing one of the same or a newer epoch stays)."""
        ...

    async def failed_workers(self) -> list[SharedMark]:
        """Every standing mark, with the time it has left."""
        ...
