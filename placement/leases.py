"""Per-name leases with fencing tokens: who among several placements acts on an app.

A lease is held by one holder (a placement process) until its TTL lapses unless
renewed. Each acquisition by a new holder gets a fencing token greater than every
token given for that name before — also across a Redis restarted empty, because
tokens come from Redis's clock in microseconds, never below the last one issued —
so an action carried out under an old token can be told from a new holder's.

A holder trusts its lease only until `acquired + ttl - margin` by its own monotonic
clock (measured from before the call that took or renewed it): Redis gives the
lease to another holder no earlier than `ttl` after that call, so two holders never
both believe they hold it (barring a clock running faster than `margin` allows).
The keeper renews every held lease every `ttl / 3` in one round trip; a lease that
could not be renewed in time is dropped and its actions stop at their next check.

Two backends: memory (one process: `thaw up`, tests) and Redis (many processes).
No consensus beyond this: the leases are advisory coordination, the agents and the
store still check what they are asked to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger("thaw.placement.leases")

MARGIN_S = 0.5  # a holder stops trusting its lease this long before Redis would free it


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


class LeaseKeeper:
    """One holder's leases: takes them, renews them in the background, says if one is
    still trustworthy. `name` is whatever the caller leases (e.g. `reconcile:APP`)."""

    def __init__(self, store: LeaseStore, ttl_s: float, *, holder: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.margin_s = min(MARGIN_S, ttl_s / 4)
        self.holder = holder or secrets.token_hex(8)
        self.clock = clock
        self.held: dict[str, Lease] = {}
        self._renewer: asyncio.Task[None] | None = None

    async def acquire(self, name: str) -> Lease | Taken:
        """The lease of `name` (ours already, renewed, or newly taken), or who has it."""
        began = self.clock()
        answer = await self.store.acquire(name, self.holder, self.ttl_s)
        if isinstance(answer, Taken):
            self.held.pop(name, None)
            return answer
        lease = Lease(name, answer, began + self.ttl_s - self.margin_s)
        previous = self.held.get(name)
        if previous is None or previous.token != lease.token:
            log.info("lease %s taken (token %d)", name, lease.token)
        self.held[name] = lease
        self._ensure_renewer()
        return lease

    async def free(self, names: list[str]) -> list[str]:
        """Those of `names` nobody holds now (one call: a dead holder's, once they lapse)."""
        held = await self.store.held(names)
        return [name for name, taken in zip(names, held, strict=True) if not taken]

    def valid(self, lease: Lease) -> bool:
        """`lease` is still ours: the same token held and not past its trusted end."""
        current = self.held.get(lease.name)
        return current is not None and current.token == lease.token \
            and self.clock() < current.expires

    async def release(self, name: str) -> None:
        lease = self.held.pop(name, None)
        if lease is not None:
            with contextlib.suppress(Exception):
                await self.store.release(name, self.holder, lease.token)

    async def renew_all(self) -> None:
        """Renew every held lease in one call. One the store says is no longer ours is
        dropped now; when the store cannot be reached, each is kept until its trusted end
        (Redis frees none of them before then)."""
        if not self.held:
            return
        began = self.clock()
        leases = list(self.held.values())
        try:
            renewed: list[bool] | None = await self.store.renew(
                [(ls.name, ls.token) for ls in leases], self.holder, self.ttl_s)
        except Exception as exc:
            log.warning("leases could not be renewed: %s", exc)
            renewed = None
        for i, lease in enumerate(leases):
            if self.held.get(lease.name) != lease:
                continue  # taken again or released meanwhile
            if renewed is not None and renewed[i]:
                self.held[lease.name] = Lease(lease.name, lease.token,
                                              began + self.ttl_s - self.margin_s)
            elif renewed is not None or self.clock() >= lease.expires:
                log.warning("lease %s (token %d) lost", lease.name, lease.token)
                del self.held[lease.name]

    def _ensure_renewer(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.create_task(self._renew_forever())

    async def _renew_forever(self) -> None:
        while self.held:
            await asyncio.sleep(self.ttl_s / 3)
            await self.renew_all()

    async def close(self) -> None:
        """Stop renewing and give every lease back (a clean stop hands over at once)."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        for name in list(self.held):
            await self.release(name)
