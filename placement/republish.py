"""Placement's side of registry loss: publish every app again under a new generation.

The apps' truth is placement's store; the registry holds copies. When the registry
answers a generation other than the one placement last published under (Redis came
back empty, or was flushed), every stored app is published again, and the reconciler
holds off acting for `grace_s`: until the agents, which notice the same change on
their next heartbeat, have published their workers and machines again, an empty view
would look like lost machines to replace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from placement.applocks import AppLocks
from placement.errors import NotFound
from placement.store import AppStore
from thaw.registry import Registry
from thaw.registry.generation import GenerationWatch

log = logging.getLogger("thaw.placement")

CHECK_EVERY_S = 1.0


class Republisher:
    def __init__(self, registry: Registry, store: AppStore, locks: AppLocks, grace_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.registry, self.store, self.locks = registry, store, locks
        self.grace_s = grace_s
        self.clock = clock
        self.watch = GenerationWatch()
        self.held_until = 0.0
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    async def check(self) -> int:
        """Read the generation; under a new one, publish every app again (how many)."""
        async with self._lock:
            token = await self.registry.generation()
            if token == self.watch.known:
                return 0
            if self.watch.lost(token):
                log.warning("the registry was lost (new generation): publishing every app "
                            "again; the reconciler waits %.1f s for the agents", self.grace_s)
                self.held_until = self.clock() + self.grace_s
            published = await self._publish_all()
            self.watch.published(token)
            return published

    async def trusted(self) -> bool:
        """Whether the registry's view may be acted on now (not lost, or lost long enough
        ago that the agents have published theirs again)."""
        await self.check()
        return self.clock() >= self.held_until

    async def _publish_all(self) -> int:
        published = 0
        for name in [config.name for config in await self.store.list()]:
            async with self.locks.hold(name):  # not racing a delete: read under its lock
                try:
                    config = await self.store.get(name)
                except NotFound:
                    continue
                await self.registry.put_app(config)
                published += 1
        return published

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the registry is away: try at the next check
                log.debug("registry generation check failed: %s", exc)
