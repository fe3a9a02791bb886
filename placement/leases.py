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

The port is placement/ports/leases.py; two backends: memory (one process: `thaw up`,
tests; placement/adapters/memory.py) and Redis (many processes; adapters/coordination.py).
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

from ground.tasks import cancel_and_wait
from placement.ports.leases import Lease, LeaseStore, Taken

log = logging.getLogger("thaw.placement.leases")

MARGIN_S = 0.5  # a holder stops trusting its lease this long before Redis would free it


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
        await cancel_and_wait(self._renewer)
        for name in list(self.held):
            await self.release(name)
