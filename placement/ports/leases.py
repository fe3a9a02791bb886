"""The lease port: per-name leases with fencing tokens, whoever keeps them (memory in one
process, Redis for many; placement/leases.py says what they are for and keeps them)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Lease:
    name: str
    token: int  # fencing token: grows with every new holder of the name
    expires: float  # the holder's own monotonic clock: trust it until then


@dataclass(frozen=True)
class Taken:
    """Someone else holds the name, for about `remaining_s` more."""

    remaining_s: float


class LeaseStore(Protocol):
    """Where leases live. `acquire` by the current holder renews it with the same token."""

    async def acquire(self, name: str, holder: str, ttl_s: float) -> int | Taken: ...

    async def renew(self, leases: list[tuple[str, int]], holder: str,
                    ttl_s: float) -> list[bool]: ...

    async def release(self, name: str, holder: str, token: int) -> None: ...

    async def held(self, names: list[str]) -> list[bool]:
        """Whether each name is held by anyone now (one call for them all)."""
        ...

    def watch(self, name: str) -> asyncio.Event:
        """An event set when `name` is next released by its holder, by any process (watch
        before trying to take it: a release between a refused `acquire` and the wait is
        not missed). The word may be lost (a store away): wait with a bound. Each `watch`
        is ended by `unwatch`."""
        ...

    def unwatch(self, name: str, event: asyncio.Event) -> None: ...

    async def close(self) -> None: ...


class Watchers:
    """Events waiting for leases' releases, by name (what `watch` hands out)."""

    def __init__(self) -> None:
        self._events: dict[str, set[asyncio.Event]] = {}

    def watch(self, name: str) -> asyncio.Event:
        event = asyncio.Event()
        self._events.setdefault(name, set()).add(event)
        return event

    def unwatch(self, name: str, event: asyncio.Event) -> None:
        events = self._events.get(name)
        if events is not None:
            events.discard(event)
            if not events:
                del self._events[name]

    def released(self, name: str) -> None:
        for event in self._events.get(name, ()):
            event.set()
