"""In-process registry backend, for `thaw up` and tests: one event loop, no IO."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence

from ground.appconfig import AppConfig
from ground.registry.types import (
    ROUTES,
    WORKERS,
    Change,
    Feed,
    MachineRecord,
    PlacementAdvert,
    WorkerStatus,
    feed_of,
)

FEED_LENGTH = 10_000


class Ring:
    """One bounded change feed: a ring of the last `FEED_LENGTH` changes. Change number
    `seq` sits at `seq % FEED_LENGTH`, so a reader finds the next one by arithmetic, never
    by a scan, and a write costs the same with 10 changes retained or 10,000."""

    def __init__(self) -> None:
        self.ring: list[Change | None] = [None] * FEED_LENGTH
        self.seq = 0  # of the newest change; changes max(1, seq - FEED_LENGTH + 1)..seq kept
        self._wakeup: asyncio.Event | None = None  # made by the first reader waiting

    def emit(self, kind: str, key: str) -> None:
        self.seq += 1
        self.ring[self.seq % FEED_LENGTH] = Change(seq=str(self.seq), kind=kind, key=key)
        if self._wakeup is not None:
            self._wakeup.set()
            self._wakeup = None

    async def changes(self, after: str | None) -> AsyncIterator[Change]:
        last = int(after) if after is not None else self.seq
        while True:
            while last < self.seq:
                # past the oldest change kept (trimmed): go on from the oldest kept
                last = max(last, self.seq - FEED_LENGTH) + 1
                change = self.ring[last % FEED_LENGTH]
                assert change is not None
                yield change
            if self._wakeup is None:
                self._wakeup = asyncio.Event()
            await self._wakeup.wait()


class MemoryRegistry:
    """Dictionaries plus two bounded change feeds (`Ring`). `clock` is monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._placements: dict[str, tuple[PlacementAdvert, float]] = {}
        self._workers: dict[str, tuple[WorkerStatus, float]] = {}
        self._epochs: dict[str, int] = {}  # outlives the TTL, like the Redis backend
        self._layers: dict[str, dict[str, int]] = {}
        self._holders: dict[str, dict[str, int]] = {}
        self._machines: dict[str, dict[str, MachineRecord]] = {}
        self._apps: dict[str, AppConfig] = {}
        self._feeds: dict[Feed, Ring] = {ROUTES: Ring(), WORKERS: Ring()}
        self._generation = secrets.token_hex(8)  # the process's memory is never lost alone
        self._republished = ""

    def _emit(self, kind: str, key: str) -> None:
        self._feeds[feed_of(kind)].emit(kind, key)

    async def publish_worker(self, status: WorkerStatus, ttl_s: float) -> str:
        if self._epochs.get(status.id, -1) <= status.epoch:
            self._epochs[status.id] = status.epoch
            self._workers[status.id] = (status, self._clock() + ttl_s)
            self._emit("worker", status.id)
        return self._generation

    async def workers(self, region: str | None = None) -> list[WorkerStatus]:
        now = self._clock()
        expired = [wid for wid, (_, until) in self._workers.items() if until <= now]
        for wid in expired:
            del self._workers[wid]
        return [
            status
            for status, _ in self._workers.values()
            if region is None or status.region == region
        ]

    async def worker(self, worker_id: str) -> WorkerStatus | None:
        held = self._workers.get(worker_id)
        return held[0] if held is not None and held[1] > self._clock() else None

    async def set_worker_layers(self, worker_id: str, layers: dict[str, int]) -> None:
        for digest in self._layers.get(worker_id, {}):
            holders = self._holders.get(digest, {})
            holders.pop(worker_id, None)
            if not holders:
                self._holders.pop(digest, None)
        self._layers[worker_id] = dict(layers)
        for digest, size in layers.items():
            self._holders.setdefault(digest, {})[worker_id] = size
        self._emit("layers", worker_id)

    async def layer_holders(self, digest: str) -> dict[str, int]:
        return dict(self._holders.get(digest, {}))

    async def put_machine(self, record: MachineRecord) -> None:
        app = self._machines.setdefault(record.app, {})
        current = app.get(record.id)
        if current is not None and current.updated_at > record.updated_at:
            return
        app[record.id] = record
        self._emit("machine", f"{record.app}/{record.id}")

    async def delete_machine(self, app: str, machine_id: str) -> None:
        if self._machines.get(app, {}).pop(machine_id, None) is not None:
            self._emit("machine", f"{app}/{machine_id}")

    async def machines(self, app: str) -> list[MachineRecord]:
        return list(self._machines.get(app, {}).values())

    async def machines_of(self, apps: Iterable[str]) -> dict[str, list[MachineRecord]]:
        return {app: list(found.values()) for app in apps if (found := self._machines.get(app))}

    async def put_app(self, config: AppConfig) -> None:
        current = self._apps.get(config.name)
        if current is not None and current.version > config.version:
            return
        self._apps[config.name] = config
        self._emit("app", config.name)

    async def put_apps(self, configs: Sequence[AppConfig]) -> None:
        for config in configs:
            await self.put_app(config)

    async def app(self, name: str) -> AppConfig | None:
        return self._apps.get(name)

    async def apps(self) -> list[AppConfig]:
        return list(self._apps.values())

    async def delete_app(self, name: str) -> None:
        if self._apps.pop(name, None) is not None:
            self._emit("app", name)

    async def publish_placement(self, advert: PlacementAdvert, ttl_s: float) -> None:
        self._placements[advert.id] = (advert, self._clock() + ttl_s)

    async def placements(self) -> list[PlacementAdvert]:
        now = self._clock()
        return [advert for _, (advert, until) in sorted(self._placements.items())
                if until > now]

    async def generation(self) -> str:
        return self._generation

    def on_connect(self, callback: Callable[[], None]) -> None:
        """Nothing to connect to, nothing ever lost: never called."""

    async def mark_republished(self, generation: str) -> None:
        if generation == self._generation:
            self._republished = generation
            self._emit("republished", generation)

    async def republished(self) -> str:
        return self._republished

    async def feed_position(self, feed: Feed = ROUTES) -> str:
        return str(self._feeds[feed].seq)

    def changes(self, after: str | None = None, block_s: float | None = None,
                feed: Feed = ROUTES) -> AsyncIterator[Change]:
        """(`block_s` means nothing here: a reader waits for the next change itself.)"""
        return self._feeds[feed].changes(after)

    def with_own_connections(self) -> MemoryRegistry:
        return self

    async def close(self) -> None:
        """Nothing to release. Readers of `changes()` are not woken: they end when their
        owners cancel them (woken with nothing new, they would only wait again)."""
