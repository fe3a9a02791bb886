"""Changes of one app happen one at a time: create, patch, deploy, delete, new machines.

Each of them reads the stored config, awaits (an image resolution, offers to
agents) and writes: two of them interleaved would lose an update, or place
machines for an app deleted meanwhile. A lock per app name serialises them in
this process (the store's version and uid checks catch the rest); the queue
of one app is bounded, so one tenant's slow registry cannot pile up requests
without end. Locks are dropped when nobody holds or waits for them.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from placement.errors import PlacementError

MAX_QUEUED = 8  # changes of one app waiting behind the one in progress


class TooMany(PlacementError):
    status = 429
    code = "too_many_requests"


class AppLocks:
    def __init__(self, max_queued: int | None = MAX_QUEUED) -> None:
        """`max_queued`: changes of one app that may wait (None: no bound)."""
        self.max_queued = max_queued
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: Counter[str] = Counter()

    @asynccontextmanager
    async def hold(self, app: str) -> AsyncIterator[None]:
        if self.max_queued is not None and self._users[app] > self.max_queued:
            raise TooMany(f"too many changes of app {app} at once; retry")
        self._users[app] += 1
        lock = self._locks.setdefault(app, asyncio.Lock())
        try:
            async with lock:
                yield
        finally:
            self._users[app] -= 1
            if not self._users[app]:
                del self._users[app]
                del self._locks[app]
