"""The registry feed that keeps the edge's view: load, follow the change feed, resync.

The view is loaded at start, refreshed per key from `registry.changes()`, and
fully resynced every `resync_interval_s`; when the registry errors the view is
kept as is (warm apps keep being served) and the feed retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from edge.view import View
from thaw.registry import MachineRecord, Registry
from thaw.registry.generation import GenerationWatch

log = logging.getLogger("thaw.edge.view")

FEED_RETRY_S = 1.0
REBUILD_GRACE_S = 10.0  # after the registry was lost: time for everyone to publish again


class RegistryFeed:
    """Loads the view, follows the change feed, resyncs; survives registry errors.

    A registry that was lost (a new generation: Redis restarted empty, or flushed) is
    being filled again by placement and the agents: for `REBUILD_GRACE_S` a load adds
    and updates but removes nothing, then one authoritative load prunes what is gone.
    """

    def __init__(self, view: View, registry: Registry, resync_interval_s: float) -> None:
        self.view = view
        self.registry = registry
        self.resync_interval_s = resync_interval_s
        self.position: str | None = None  # of the last change applied
        self.generation = GenerationWatch()
        self.rebuilding_until = 0.0  # loop time: until then loads only add
        self.loaded = False  # a full load has reached the view (readiness)
        self._resync_now = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def load(self) -> None:
        """Read everything first, then apply: a registry lost half-way through a load
        never empties the view."""
        position = await self.registry.feed_position()
        token = await self.registry.generation()
        configs = await self.registry.apps()
        records = {c.name: await self.registry.machines(c.name) for c in configs}
        after = await self.registry.generation()
        loop = asyncio.get_running_loop()
        if after != token or self.generation.lost(token):
            log.warning("the registry was lost (new generation): keeping the view while "
                        "placement and the agents publish theirs again")
            self.rebuilding_until = loop.time() + REBUILD_GRACE_S
            loop.call_later(REBUILD_GRACE_S, self._resync_now.set)
            self.position = None if after != token else position  # the old feed is gone
        elif self.position is None:
            self.position = position
        self.generation.published(after)
        prune = loop.time() >= self.rebuilding_until
        self.view.set_apps(configs, prune=prune)
        for config in configs:
            self._apply_machines(config.name, records[config.name], prune=prune)
        self.loaded = True

    def _apply_machines(self, app: str, records: list[MachineRecord], *, prune: bool) -> None:
        entry = self.view.apps.get(app)
        if entry is None:
            return
        found = {r.id: r for r in records}
        ids = set(entry.machines) | set(found) if prune else set(found)
        for machine_id in ids:
            self.view.apply_record(app, machine_id, found.get(machine_id))

    async def refresh(self, kind: str, key: str) -> None:
        if kind == "app":
            self.view.set_app(key, await self.registry.app(key))
            if key in self.view.apps:  # machines that went come as their own changes
                self._apply_machines(key, await self.registry.machines(key), prune=False)
        elif kind == "machine":
            app, _, machine_id = key.partition("/")
            if app in self.view.apps:
                records = await self.registry.machines(app)
                found = next((r for r in records if r.id == machine_id), None)
                self.view.apply_record(app, machine_id, found)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._follow()), asyncio.create_task(self._resync())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _follow(self) -> None:
        """Follow the feed from the position taken before the first load, so no change
        written during the load is missed; after an error, resume from the last one seen
        and reload (the stream may have been trimmed past it)."""
        while True:
            try:
                async for change in self.registry.changes(after=self.position):
                    self.position = change.seq
                    await self.refresh(change.kind, change.key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("registry feed failed, keeping the view: %s", exc)
            await asyncio.sleep(FEED_RETRY_S)
            with contextlib.suppress(Exception):
                await self.load()

    async def _resync(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.resync_interval_s):
                    await self._resync_now.wait()
            self._resync_now.clear()
            try:
                await self.load()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("registry resync failed, keeping the view: %s", exc)
