"""In-process registry backend, for `thaw up` and tests: one event loop, no IO."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

from thaw.appconfig import AppConfig
from thaw.registry.types import Change, MachineRecord, WorkerStatus

FEED_LENGTH = 10_000


class MemoryRegistry:
    """Dictionaries plus a bounded change feed. `clock` is monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._workers: dict[str, tuple[WorkerStatus, float]] = {}
        self._epochs: dict[str, int] = {}  # outlives the TTL, like the Redis backend
        self._layers: dict[str, dict[str, int]] = {}
        self._holders: dict[str, dict[str, int]] = {}
        self._machines: dict[str, dict[str, MachineRecord]] = {}
        self._apps: dict[str, AppConfig] = {}
        self._feed: deque[Change] = deque(maxlen=FEED_LENGTH)
        self._seq = 0
        self._wakeup = asyncio.Event()
        self._generation = secrets.token_hex(8)  # the process's memory is never lost alone

    def _emit(self, kind: str, key: str) -> None:
        self._seq += 1
        self._feed.append(Change(seq=str(self._seq), kind=kind, key=key))
        self._wakeup.set()
        self._wakeup = asyncio.Event()

    async def publish_worker(self, status: WorkerStatus, ttl_s: float) -> None:
        if self._epochs.get(status.id, -1) > status.epoch:
            return
        self._epochs[status.id] = status.epoch
        self._workers[status.id] = (status, self._clock() + ttl_s)
        self._emit("worker", status.id)

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

    async def put_app(self, config: AppConfig) -> None:
        current = self._apps.get(config.name)
        if current is not None and current.version > config.version:
            return
        self._apps[config.name] = config
        self._emit("app", config.name)

    async def app(self, name: str) -> AppConfig | None:
        return self._apps.get(name)

    async def apps(self) -> list[AppConfig]:
        return list(self._apps.values())

    async def delete_app(self, name: str) -> None:
        if self._apps.pop(name, None) is not None:
            self._emit("app", name)

    async def generation(self) -> str:
        return self._generation

    async def feed_position(self) -> str:
        return str(self._seq)

    async def changes(self, after: str | None = None) -> AsyncIterator[Change]:
        last = int(after) if after is not None else self._seq
        while True:
            pending = [c for c in self._feed if int(c.seq) > last]
            for change in pending:
                last = int(change.seq)
                yield change
            if not pending:
                await self._wakeup.wait()

    async def close(self) -> None:
        self._wakeup.set()
