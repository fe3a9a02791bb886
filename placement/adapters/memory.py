"""The coordination ports kept in one process's memory: `thaw up`'s one placement, and
several placements in one process in tests (the Redis backends: adapters/coordination.py;
both are held to tests/contract/test_coordination_contract.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from placement.core.claims import Claims
from placement.ports.failures import MAX_REPORTS, SharedMark
from placement.ports.leases import Taken, Watchers


class MemoryLeaseStore:
    """One process's leases (several holders may share it, as in tests)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._held: dict[str, tuple[str, int, float]] = {}  # name -> holder, token, until
        self._last_token = 0
        self._watchers = Watchers()

    async def acquire(self, name: str, holder: str, ttl_s: float) -> int | Taken:
        now = self._clock()
        current = self._held.get(name)
        if current is not None and current[2] > now and current[0] != holder:
            return Taken(current[2] - now)
        if current is not None and current[2] > now:
            token = current[1]
        else:
            self._last_token = token = max(self._last_token + 1, time.time_ns() // 1000)
        self._held[name] = (holder, token, now + ttl_s)
        return token

    async def renew(self, leases: list[tuple[str, int]], holder: str,
                    ttl_s: float) -> list[bool]:
        now = self._clock()
        renewed = []
        for name, token in leases:
            current = self._held.get(name)
            ok = current is not None and current[:2] == (holder, token) and current[2] > now
            if ok:
                self._held[name] = (holder, token, now + ttl_s)
            renewed.append(ok)
        return renewed

    async def release(self, name: str, holder: str, token: int) -> None:
        current = self._held.get(name)
        if current is not None and current[:2] == (holder, token):
            del self._held[name]
            self._watchers.released(name)

    async def held(self, names: list[str]) -> list[bool]:
        now = self._clock()
        return [name in self._held and self._held[name][2] > now for name in names]

    def watch(self, name: str) -> asyncio.Event:
        return self._watchers.watch(name)

    def unwatch(self, name: str, event: asyncio.Event) -> None:
        self._watchers.unwatch(name, event)

    async def close(self) -> None:
        return None


@dataclass
class MemoryClaimBook:
    """Several placements in one process (tests); `thaw up` has one, which sees none."""

    clock: Callable[[], float] = time.monotonic
    book: dict[str, dict[str, tuple[Claims, float]]] = field(default_factory=dict)
    demands: dict[str, dict[str, tuple[int, float]]] = field(default_factory=dict)

    async def others(self, app: str, me: str) -> Claims:
        now = self.clock()
        total = Claims()
        for who, (claims, until) in self.book.get(app, {}).items():
            if who != me and until > now:
                total = total.plus(claims)
        return total

    async def publish(self, app: str, me: str, claims: Claims, ttl_s: float) -> None:
        entries = self.book.setdefault(app, {})
        if claims == Claims():
            entries.pop(me, None)
            if not entries:
                del self.book[app]
        else:
            entries[me] = (claims, self.clock() + ttl_s)

    async def report(self, app: str, edge: str, demand: int, ttl_s: float) -> int:
        now = self.clock()
        entries = self.demands.setdefault(app, {})
        if demand > 0:
            entries[edge] = (demand, now + ttl_s)
        else:
            entries.pop(edge, None)
        for who in [w for w, (_, until) in entries.items() if until <= now]:
            del entries[who]
        if not entries:
            del self.demands[app]
        return sum(d for d, _ in entries.values())

    async def lapse(self, app: str, edge: str, demand: int, ttl_s: float) -> None:
        entries, now = self.demands.get(app, {}), self.clock()
        if edge in entries and entries[edge][0] == demand and entries[edge][1] > now:
            entries[edge] = (demand, now + ttl_s)


@dataclass
class MemoryFailureBook:
    """Several placements in one process (tests)."""

    clock: Callable[[], float] = time.monotonic
    reports: dict[tuple[str, int], dict[tuple[str, str], float]] = field(
        default_factory=dict)  # (worker, epoch) -> (reporter, machine) -> when
    marks: dict[str, tuple[int, float, str]] = field(default_factory=dict)  # epoch, until

    async def suspect(self, worker: str, epoch: int, reporter: str, machine: str,
                      window_s: float) -> list[tuple[str, str]]:
        now = self.clock()
        seen = {key: at for key, at in self.reports.get((worker, epoch), {}).items()
                if now - at <= window_s}
        if len(seen) < MAX_REPORTS or (reporter, machine) in seen:
            seen[(reporter, machine)] = now
        self.reports[(worker, epoch)] = seen
        return list(seen)

    async def mark_failed(self, worker: str, epoch: int, reason: str, ttl_s: float) -> None:
        now = self.clock()
        current = self.marks.get(worker)
        if current is not None and current[1] > now and current[0] >= epoch:
            return
        self.marks[worker] = (epoch, now + ttl_s, reason)

    async def failed_workers(self) -> list[SharedMark]:
        now = self.clock()
        for worker in [w for w, (_, until, _) in self.marks.items() if until <= now]:
            del self.marks[worker]
        return [SharedMark(w, epoch, until - now, reason)
                for w, (epoch, until, reason) in self.marks.items()]
