"""When the reconciler looks at an app, and whether this placement is the one to.

Passes over an app are asked for (`poke`) by app changes, deploys, the registry's
change feed (an app's or a machine's change: that app, whichever placement made it;
a new worker: every app) and a timer. One
pass at a time per app; one asked for while one runs runs after it.

Several placements may share a platform: a pass runs only under the app's
reconcile lease (`reconcile:APP`, placement/leases.py), so exactly one placement
acts on an app at a time. A placement that finds the lease taken tries again when
it would lapse, so a dead holder is replaced within the lease's TTL; a live holder
renews it and keeps the app (no flapping between placements).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from placement.errors import NotFound, PlacementError
from placement.leases import Lease, LeaseKeeper, Taken
from thaw.registry import Change, Registry
from thaw.registry.follow import follow

log = logging.getLogger("thaw.placement")
RETRY_AFTER_LAPSE_S = 0.05  # asked again this long after another holder's lease would lapse


@dataclass
class AppPasses:
    passing: bool = False
    again: bool = False
    retry: asyncio.TimerHandle | None = None


def lease_name(app: str) -> str:
    return f"reconcile:{app}"


class Passes:
    def __init__(
        self, run: Callable[[str, Lease], Awaitable[object]],
        apps: Callable[[], Awaitable[list[str]]], registry: Registry, keeper: LeaseKeeper,
        *, period_s: float, new_worker: Callable[[str], bool],
        forget: Callable[[str], None],
    ) -> None:
        """`run(app, lease)`: one pass; `apps()`: every app's name (the store);
        `new_worker(id)`: a worker not seen live at the last pass; `forget(app)`: the app
        is gone (a pass found no such app)."""
        self.run, self.apps, self.registry, self.keeper = run, apps, registry, keeper
        self.period_s = period_s
        self.new_worker = new_worker
        self.forget_app = forget
        self.state: dict[str, AppPasses] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.position: str | None = None  # in the registry's feed (None: from the start)
        self._loops: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._loops = [asyncio.create_task(self._timer()), asyncio.create_task(self._feed())]

    async def close(self) -> None:
        for state in self.state.values():
            if state.retry is not None:
                state.retry.cancel()
        tasks = [*self._loops, *self.tasks]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.keeper.close()

    def poke(self, app: str) -> None:
        state = self.state.setdefault(app, AppPasses())
        if state.passing:
            state.again = True
            return
        state.passing = True
        task = asyncio.create_task(self._passes(app, state))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def forget(self, app: str) -> None:
        """`app` is deleted: no more passes, and its lease goes back at once."""
        state = self.state.pop(app, None)
        if state is not None and state.retry is not None:
            state.retry.cancel()
        await self.keeper.release(lease_name(app))

    async def _passes(self, app: str, state: AppPasses) -> None:
        try:
            while True:
                state.again = False
                if not await self._one(app, state):
                    return
                if not state.again:
                    return
        finally:
            state.passing = False

    async def _one(self, app: str, state: AppPasses) -> bool:
        """One pass, if this placement holds the app's lease; False: no more passes now."""
        try:
            lease = await self.keeper.acquire(lease_name(app))
        except PlacementError as exc:
            log.warning("reconcile %s: lease unavailable: %s", app, exc.message)
            return False
        if isinstance(lease, Taken):
            self._retry_at_lapse(app, state, lease.remaining_s)
            return False
        try:
            await self.run(app, lease)
        except NotFound:
            self.forget_app(app)
            await self.forget(app)
            return False
        except Exception:
            log.exception("reconcile pass over app %s failed", app)
        return True

    def _retry_at_lapse(self, app: str, state: AppPasses, remaining_s: float) -> None:
        if state.retry is not None and not state.retry.cancelled():
            state.retry.cancel()
        loop = asyncio.get_running_loop()
        state.retry = loop.call_later(remaining_s + RETRY_AFTER_LAPSE_S, self.poke, app)

    async def _timer(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            try:
                names = await self.apps()
            except PlacementError as exc:  # the store is away: the next tick tries again
                log.warning("reconciler: %s", exc.message)
                continue
            for name in names:
                self.poke(name)

    async def _feed(self) -> None:
        """An app's or a machine's change asks for a pass over that app; a new worker's,
        over every app. After a feed error it resumes where it was (the timer goes on
        meanwhile)."""
        await follow(self.registry, self, self._seen, _nothing, "reconciler")

    async def _seen(self, change: Change) -> None:
        if change.kind == "machine":
            self.poke(change.key.split("/", 1)[0])
        elif change.kind == "app":  # changed or deployed, maybe through another placement
            self.poke(change.key)
        elif change.kind == "worker" and self.new_worker(change.key):
            for name in await self.apps():
                self.poke(name)


async def _nothing() -> None:
    """Nothing to reload: a missed change is seen by the next timer pass."""
