"""Placement's in-memory view of the live workers: per region, updated change by change.

`start()` loads every worker (in slices, yielding to the loop between them), then
follows the workers' feed (`registry.changes(feed=WORKERS)`: heartbeats and layer
sets, which the edges' routes feed does not carry) from the position taken before the
load: a `worker` or `layers` change marks that worker dirty, and a flush (at most every
`flush_interval_s`) reads the registry once and applies only the dirty workers,
plus removes the ones whose heartbeat expired. A feed error keeps the index as is
and reloads. The reservations of placement's own offers live beside it, in the
ledger, until the workers' heartbeats carry them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Protocol

from ground.registry.follow import FEED_RETRY_S, follow
from ground.registry.types import ROUTES, WORKERS, Change, Feed, WorkerStatus
from ground.tasks import cancel_and_wait
from placement.core.index import RegionIndex, ReservationLedger

log = logging.getLogger("thaw.placement")

LOAD_SLICE = 2_000  # workers applied between two yields to the loop
RESYNC_INTERVAL_S = 60.0


class WorkerFeed(Protocol):
    """What the index needs of the registry (`ground.registry.Registry` is one)."""

    async def workers(self, region: str | None = None) -> list[WorkerStatus]: ...

    async def feed_position(self, feed: Feed = ROUTES) -> str: ...

    def changes(self, after: str | None = None, block_s: float | None = None,
                feed: Feed = ROUTES) -> AsyncIterator[Change]: ...


class FleetIndex:
    def __init__(self, registry: WorkerFeed, *, hold_s: float,
                 flush_interval_s: float = 0.25,
                 resync_interval_s: float = RESYNC_INTERVAL_S) -> None:
        """`hold_s`: how long an offer's reservation counts without a heartbeat carrying it
        (a few heartbeat intervals)."""
        self.registry = registry
        self.flush_interval_s = flush_interval_s
        self.resync_interval_s = resync_interval_s
        self.ledger = ReservationLedger(hold_s)
        self.regions: dict[str, RegionIndex] = {}
        self.position: str | None = None  # of the last change seen
        self.loaded = False
        self._region_of: dict[str, str] = {}  # worker id -> region it is indexed in
        self._dirty: set[str] = set()
        self._unknown_dirty = False  # a dirty worker is not indexed yet (catch_up flushes)
        self._kick = asyncio.Event()
        # told each worker's heartbeat as it is applied (republish.py `heard`)
        self.on_worker: Callable[[WorkerStatus], None] | None = None
        self._starting: asyncio.Future[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def region(self, name: str) -> RegionIndex:
        index = self.regions.get(name)
        if index is None:
            index = self.regions[name] = RegionIndex()
        return index

    async def start(self) -> None:
        """Load, then follow the feed; idempotent (a second call waits for the first);
        a load that failed (the registry away) is tried again by the next call."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        starting = self._starting
        try:
            await asyncio.shield(starting)
        except Exception:
            if self._starting is starting:
                self._starting = None
            raise

    async def _start(self) -> None:
        await self.load()
        self._tasks = [asyncio.create_task(self._follow()),
                       asyncio.create_task(self._flushes()),
                       asyncio.create_task(self._resync())]

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
        self._tasks = []
        self._starting = None

    async def load(self) -> None:
        """Every worker, read at once and applied in slices; workers gone are removed."""
        position = await self.registry.feed_position(WORKERS)
        workers = await self.registry.workers()
        seen: set[str] = set()
        for at in range(0, len(workers), LOAD_SLICE):
            for worker in workers[at:at + LOAD_SLICE]:
                self.apply(worker)
                seen.add(worker.id)
            await asyncio.sleep(0)
        for worker_id in set(self._region_of) - seen:
            self.forget(worker_id)
        if self.position is None:
            self.position = position
        self.loaded = True

    async def prewarm(self, images: Iterable[tuple[str, Mapping[str, int]]], k: int) -> int:
        """Compute the top `k` holders of each (region, image layers) ahead, so that no
        decision pays for the first (O(holders): 0.1 s for an image over popular base
        layers at 100,000 workers), yielding to the loop every few thousand holders;
        the number of images gone through."""
        done = 0
        for region, layers in images:
            if layers:
                for _ in self.region(region).compute_top_steps(layers, k):
                    await asyncio.sleep(0)
                done += 1
        return done

    def apply(self, worker: WorkerStatus) -> None:
        region = self._region_of.get(worker.id)
        if region is not None and region != worker.region:
            self.regions[region].remove(worker.id)
        self._region_of[worker.id] = worker.region
        self.region(worker.region).upsert(worker)
        if self.on_worker is not None:
            self.on_worker(worker)

    def forget(self, worker_id: str) -> None:
        region = self._region_of.pop(worker_id, None)
        if region is not None:
            self.regions[region].remove(worker_id)

    async def catch_up(self) -> None:
        """Before a decision: flush now if the feed told of a worker the index does not
        have yet (a new worker is offered at once; known ones' heartbeats wait for the
        next periodic flush, which keeps a decision from reading the whole registry)."""
        if self._unknown_dirty:
            await self.flush()

    async def flush(self) -> None:
        """Apply the dirty workers as the registry has them now (absent: gone)."""
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, set()
        unknown, self._unknown_dirty = self._unknown_dirty, False
        try:
            current = {w.id: w for w in await self.registry.workers()}
        except Exception:
            self._dirty |= dirty
            self._unknown_dirty |= unknown
            raise
        for count, worker_id in enumerate(dirty, 1):
            worker = current.get(worker_id)
            if worker is None:
                self.forget(worker_id)
            else:
                self.apply(worker)
            if count % LOAD_SLICE == 0:
                await asyncio.sleep(0)
        for worker_id in [w for w in self._region_of if w not in current]:
            self.forget(worker_id)  # its heartbeat expired: no change says so

    async def _follow(self) -> None:
        await follow(self.registry, self, self._seen, self.load, "fleet index", feed=WORKERS)

    async def _seen(self, change: Change) -> None:
        if change.kind in ("worker", "layers"):
            self._dirty.add(change.key)
            self._unknown_dirty |= change.key not in self._region_of
            self._kick.set()

    async def _flushes(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            try:
                await self.flush()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("fleet index: registry read failed, keeping the index: %s", exc)
                self._kick.set()
                await asyncio.sleep(FEED_RETRY_S)
            await asyncio.sleep(self.flush_interval_s)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.resync_interval_s)
            try:
                await self.load()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("fleet index: resync failed, keeping the index: %s", exc)
