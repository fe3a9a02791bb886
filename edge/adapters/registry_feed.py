"""The registry feed that keeps the edge's view: load, follow the change feed, resync.

The view is loaded at start, refreshed per key from `registry.changes()`, and
fully resynced every `resync_interval_s` if anything was written since the feed's last
change (a quiet registry costs a resync one read); when the registry errors the view is
kept as is (warm apps keep being served) and the feed retries. A full load
costs O(apps + machines) in a few round trips (`machines_of`) and is applied in
slices with the loop turning in between, so warm requests are not held behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Sequence
from typing import Any

from edge.view import View
from ground.appconfig import AppConfig
from ground.registry import MachineRecord, Registry
from ground.registry.follow import follow
from ground.registry.generation import GenerationWatch, view_whole
from ground.registry.types import Change
from ground.tasks import cancel_and_wait

log = logging.getLogger("thaw.edge.view")

# After the registry was lost: the longest the view is kept (added to, never pruned)
# without placement's word that everything is published again; while waiting, the
# marker is read every REBUILD_POLL_S (its change may come before the feed is followed)
# and the view is loaded again only once it is there.
REBUILD_BOUND_S = 60.0
REBUILD_POLL_S = 0.5
LOAD_SLICE = 100  # apps a load applies between two turns of the event loop
# one read of the change feed waits this long for a change: a quiet registry costs the
# edge a round trip in this long, not every second (the edge notices nothing by the
# feed: Redis restarted closes the connection at once, and a stalled one is waited out
# with the view kept, whatever the read's length)
FEED_BLOCK_S = 30.0
NO_MACHINES: tuple[MachineRecord, ...] = ()


class RegistryFeed:
    """Loads the view, follows the change feed, resyncs; survives registry errors.

    A registry that was lost (a new generation: Redis restarted empty, or flushed) is
    being filled again by placement and the agents: until a placement marks the current
    generation republished (`Registry.republished()`, written once the workers are back
    too), or for at most `REBUILD_BOUND_S`, a load adds and updates but removes nothing;
    then one authoritative load prunes what is gone.
    """

    def __init__(self, view: View, registry: Registry, resync_interval_s: float) -> None:
        self.view = view
        self.registry = registry
        self.resync_interval_s = resync_interval_s
        self.position: str | None = None  # of the last change applied
        self.generation = GenerationWatch()
        self.rebuilding: tuple[str, float] | None = None  # (generation, loop time seen)
        self.loaded = False  # a full load has reached the view (readiness)
        self._resync_now = asyncio.Event()
        self._loading = asyncio.Lock()
        # (kind, key) of the changes the feed refreshed while a load runs: newer than it
        self._touched: set[tuple[str, str]] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def load(self) -> None:
        """Read everything first, then apply: a registry lost half-way through a load
        never empties the view. One load at a time."""
        async with self._loading:
            self._touched = set()
            try:
                await self._load()
            finally:
                self._touched = None

    async def _load(self) -> None:
        position = await self.registry.feed_position()
        token = await self.registry.generation()
        marker = await self.registry.republished()  # before the reads it vouches for
        configs = await self.registry.apps()
        records = await self.registry.machines_of([c.name for c in configs])
        after = await self.registry.generation()
        now = asyncio.get_running_loop().time()
        if after != token or self.generation.lost(token):
            if self.rebuilding is None or self.rebuilding[0] != after:
                log.warning("the registry was lost (new generation): keeping the view "
                            "until placement says it is filled again (at most %.0f s)",
                            REBUILD_BOUND_S)
                self.rebuilding = (after, now)
            self.position = None if after != token else position  # the old feed is gone
        elif self.position is None:
            self.position = position
        self.generation.published(after)
        await self._apply(configs, records, prune=self._whole(marker, token, now))
        self.loaded = True

    def _whole(self, marker: str, token: str, now: float) -> bool:
        """Whether this load may drop what the registry lacks: no loss under way, or the
        one under way is over (marked republished under `token`, or past the bound)."""
        if self.rebuilding is None:
            return True
        generation, since = self.rebuilding
        if token != generation or not view_whole(marker, generation, since, now,
                                                 REBUILD_BOUND_S):
            return False
        if marker == generation:
            log.warning("the registry is filled again: the view is authoritative again "
                        "after %.2f s", now - since)
        else:
            log.warning("the registry was not marked filled again in %.0f s: the view "
                        "drops what it lacks anyway", REBUILD_BOUND_S)
        self.rebuilding = None
        return True

    def state(self) -> dict[str, Any]:
        """For /v1/state: the generation the view follows, and whether it is kept whole
        after a loss (`rebuilding`: nothing is dropped yet) and since when (seconds)."""
        since = self.rebuilding[1] if self.rebuilding is not None else None
        now = asyncio.get_running_loop().time()
        return {"generation": self.generation.known or "", "loaded": self.loaded,
                "rebuilding": since is not None,
                "rebuilding_for_s": round(now - since, 3) if since is not None else 0.0}

    async def _apply(self, configs: list[AppConfig], records: dict[str, list[MachineRecord]],
                     *, prune: bool) -> None:
        """Apply a load app by app, `LOAD_SLICE` apps between two turns of the loop, so
        that a load of 10,000 apps never holds the loop for long. Each app (its config
        and machines) changes whole. What the feed refreshed since the load began was
        read after the load's reads: it is left as the feed left it."""
        names = {config.name for config in configs}
        gone = [name for name in self.view.apps if name not in names] if prune else []
        changes = itertools.chain(((name, None) for name in gone),
                                  ((config.name, config) for config in configs))
        for done, (name, config) in enumerate(changes):
            if done and done % LOAD_SLICE == 0:
                await asyncio.sleep(0)
            if not self._was_refreshed("app", name):
                self.view.set_app(name, config)
                self._apply_machines(name, records.get(name, NO_MACHINES), prune=prune)

    def _was_refreshed(self, kind: str, key: str) -> bool:
        return self._touched is not None and (kind, key) in self._touched

    def _apply_machines(self, app: str, records: Sequence[MachineRecord], *,
                        prune: bool) -> None:
        entry = self.view.apps.get(app)
        if entry is None:
            return
        found = {r.id: r for r in records}
        ids = set(entry.machines) | set(entry.resting) | set(found) if prune else set(found)
        for machine_id in ids:
            if not self._was_refreshed("machine", f"{app}/{machine_id}"):
                self.view.apply_record(app, machine_id, found.get(machine_id))

    async def refresh(self, kind: str, key: str) -> None:
        """One change from the feed: read the key again and apply it."""
        if self._touched is not None:
            self._touched.add((kind, key))
        if kind == "republished":
            if self.rebuilding is not None:
                self._resync_now.set()  # the view may be whole: one load to say
        elif kind == "app" and self.rebuilding is not None:
            # a refill republishes every app, each a change: read one by one (two round
            # trips each) they delayed the marker's load by seconds at 2,000 apps; the
            # kept view has them as they were, and that load brings what changed
            return
        elif kind == "app":
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
        await cancel_and_wait(*self._tasks)

    async def _follow(self) -> None:
        """Follow the feed from the position taken before the first load, so no change
        written during the load is missed; after an error, resume from the last one seen
        and reload (the stream may have been trimmed past it)."""
        await follow(self.registry, self, self._refresh_change, self.load, "edge view",
                     FEED_BLOCK_S)

    async def _refresh_change(self, change: Change) -> None:
        await self.refresh(change.kind, change.key)

    async def _worth_a_load(self) -> bool:
        """Nothing written since the last change the feed brought (the feed's newest is
        where the view is: every write to an app or a machine is a change, and a registry
        flushed or restarted has another newest), a full load would read the view it
        has: skipped, for one read of the feed's newest. While the view is kept after a
        loss, a full load adds nothing the feed does not (every publish is a change):
        only the one that may prune is worth doing, once the marker is there or the bound
        passed (one key read to know; loads back to back of 2,000 apps delayed the
        pruning one by seconds)."""
        if self.rebuilding is None:
            return self.position is None or await self.registry.feed_position() != self.position
        generation, since = self.rebuilding
        return view_whole(await self.registry.republished(), generation, since,
                          asyncio.get_running_loop().time(), REBUILD_BOUND_S)

    async def _resync(self) -> None:
        while True:
            wait_s = self.resync_interval_s if self.rebuilding is None else REBUILD_POLL_S
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._resync_now.wait()
            self._resync_now.clear()
            try:
                if await self._worth_a_load():
                    await self.load()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("registry resync failed, keeping the view: %s", exc)
