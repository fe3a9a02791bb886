"""What wakes are starting, shared by every placement: one app's wakes are single-flight.

A wake plans from the app's machines (the registry) plus what other wakes are
already starting: machines they claimed (being started) and new ones they are
placing (that no agent reports yet). In one process those are two dictionaries;
with several placements on one Redis each publishes its own under the app's key,
and a wake plans while holding a short per-app wake lease, so two edges' bursts
reaching two placements at once are planned one after the other and together
start what both asked for — not twice as many, not half.

Published claims expire (`CLAIM_TTL_S`, by Redis's clock) unless refreshed, so a
placement that dies holding claims blocks nobody for long; a placement refreshes
its own while it has any. A new machine is "placing" until an agent has made it,
then claimed until its start ends (the registry may not show it yet, or show it
created while its image is pulled); a machine still starting after that is one a
later wake waits for (as one placement's wakes always did) rather than start another.

Edges report their demand with each wake (requests held or in flight there for the
app, as Knative's activators report theirs to the autoscaler), kept per edge beside
the claims while the wake runs and `DEMAND_AFTER_S` after. A wake is sized from the
sum: each edge sees only its own requests, and counts every machine it can route to
as its own, so two edges sizing their wakes alone start too few.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable

from ground.tasks import cancel_and_wait
from placement.adapters.memory import MemoryClaimBook, MemoryLeaseStore
from placement.applocks import AppLocks
from placement.core.claims import Changed, ClaimLedger, Claims
from placement.errors import PlacementError
from placement.ports.claims import ClaimBook
from placement.ports.leases import LeaseStore, Taken

log = logging.getLogger("thaw.placement.wakes")

CLAIM_TTL_S = 3.0
DEMAND_AFTER_S = 3.0  # an edge's demand counts while its wake runs and this long after
WAKE_LEASE_TTL_S = 2.0  # planning takes milliseconds: the lease only outlives a dead planner
# A wake waiting for another placement's wake lease is woken by its release; should that
# word be lost (the release channel away), it tries again this often.
LEASE_RECHECK_S = 0.1


class WakeClaims:
    """This placement's claims (placement/core/claims.py's rules; the waker tells it what
    its wakes plan, place and start) shared with every placement's, and the way to plan
    with everyone's."""

    def __init__(self, book: ClaimBook | None = None, leases: LeaseStore | None = None,
                 me: str = "local") -> None:
        self.book: ClaimBook = book or MemoryClaimBook()
        self.leases: LeaseStore = leases or MemoryLeaseStore()
        self.me = me
        self.ledger = ClaimLedger()
        self._plans = AppLocks(max_queued=None)  # one wake of an app planning here at a time
        self._dirty: set[str] = set()  # apps whose claims changed since last published
        self._published_at: dict[str, float] = {}  # loop time each app's were last sent
        self._sends = AppLocks(max_queued=None)  # one send of an app's claims at a time
        self._changed = asyncio.Event()
        self._publisher: asyncio.Task[None] | None = None
        # `report_after`'s lapse under way, by (app, edge): that edge's next report waits
        # for it, as it waited for the wake's answer when the lapse was sent before it
        self._lapses: dict[tuple[str, str], asyncio.Task[None]] = {}

    def mine(self, app: str) -> Claims:
        return self.ledger.of(app)

    def placing(self, app: str) -> int:
        """New machines this placement's wakes are placing for `app`."""
        return self.ledger.placing(app)

    def planned(self, app: str, reuse: Iterable[str], new: int) -> None:
        """A wake's plan, while planning: the machines it restarts, how many it places."""
        self._follow(self.ledger.planned(app, reuse, new))

    def place_another(self, app: str) -> None:
        self._follow(self.ledger.place_another(app))

    def placed(self, app: str, machine: str | None) -> None:
        """A new machine's placing ended: made as `machine`, or not made (None)."""
        self._follow(self.ledger.placed(app, machine))

    def unclaim(self, app: str, machine: str) -> None:
        """A wake is done starting `machine`."""
        self._follow(self.ledger.started(app, machine))

    async def everyone(self, app: str) -> Claims:
        """What every placement's wakes of `app` are starting (for the reconciler)."""
        return self.mine(app).plus(await self._others(app))

    @contextlib.asynccontextmanager
    async def planning(self, app: str, until: float) -> AsyncIterator[Claims]:
        """Plan a wake of `app`: yields what other wakes (here and elsewhere) are starting;
        the caller says its plan (`planned`) before leaving, which publishes it before
        the next wake may plan. `until`: loop time to give up (504)."""
        async with self._plans.hold(app):
            token = await self._take_wake_lease(app, until)
            try:
                yield self.mine(app).plus(await self._others(app))
                # the plan, published before the next wake may plan: the change it
                # made needs no second publish (a change after this one is dirty again)
                # unless this one does not get there (failed, or its wake cancelled)
                self._dirty.discard(app)
                sent = False
                try:
                    sent = await self._publish(app)
                finally:
                    if not sent:
                        self._mark(app)
            finally:
                with contextlib.suppress(Exception):
                    await self.leases.release(f"wake:{app}", self.me, token)

    async def _take_wake_lease(self, app: str, until: float) -> int:
        """The app's wake lease, waiting (until `until`) for another placement's planning
        to release it: woken by the release, not by polling."""
        loop = asyncio.get_running_loop()
        name = f"wake:{app}"
        while True:
            released = self.leases.watch(name)  # before the try: its release is not missed
            try:
                answer = await self.leases.acquire(name, self.me, WAKE_LEASE_TTL_S)
                if not isinstance(answer, Taken):
                    return answer
                left = until - loop.time()
                if left <= 0:
                    raise PlacementError(f"another placement is planning a wake of {app}",
                                         code="deadline", status=504)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(released.wait(), min(left, LEASE_RECHECK_S,
                                                                 answer.remaining_s))
            finally:
                self.leases.unwatch(name, released)

    async def _others(self, app: str) -> Claims:
        return await self.book.others(app, self.me)

    async def report(self, app: str, edge: str, demand: int, ttl_s: float) -> int:
        """`edge` holds or forwards `demand` requests of `app` (said by its wake, reported
        while planning it, standing `ttl_s`): every edge's demand, summed. After the lapse
        of this edge's last wake of `app`, if one is still under way (it checks only the
        demand's value: landing after this report, it would cut this wake's entry short)."""
        pending = self._lapses.get((app, edge))
        if pending is not None:
            await asyncio.wait([pending])
        return await self.book.report(app, edge, demand, ttl_s)

    def report_after(self, app: str, edge: str, demand: int) -> None:
        """`edge`'s wake is answered: the `demand` it said stands `DEMAND_AFTER_S` more (a
        burst on another edge just after is sized with it), then lapses unless a wake or
        the edge's load share renews it. Only if it is still the edge's: its load share
        writes the demand as of now every round, and the wake's, as of its start, would
        replace that (a 200-request burst over two edges found one edge's 100 gone back
        to the 1 its first wake said, and started 6 machines, not 8). Sent beside the
        answer, not before it (a round trip of a resume's ~10 ms); after the one before it
        for the same app and edge, if that is still under way."""
        key = (app, edge)
        task = asyncio.create_task(self._lapse(app, edge, demand, self._lapses.get(key)))
        self._lapses[key] = task
        task.add_done_callback(lambda done: self._lapse_done(key, done))

    def _lapse_done(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._lapses.get(key) is task:
            del self._lapses[key]

    async def _lapse(self, app: str, edge: str, demand: int,
                     after: asyncio.Task[None] | None) -> None:
        if after is not None:
            await asyncio.wait([after])
        try:
            await self.book.lapse(app, edge, demand, DEMAND_AFTER_S)
        except Exception as exc:  # it lapses at its first expiry instead
            log.warning("demand of %s at edge %s could not be refreshed: %s", app, edge, exc)

    def _follow(self, changed: Changed) -> None:
        """The app's claims changed: published soon (in order, coalesced), and refreshed
        while not empty."""
        self._mark(changed.app)

    def _mark(self, app: str) -> None:
        self._dirty.add(app)
        self._changed.set()
        if self._publisher is None or self._publisher.done():
            self._publisher = asyncio.create_task(self._publish_dirty())

    async def _publish_dirty(self) -> None:
        """Publish each change at once, and refresh the claims that stand every
        `CLAIM_TTL_S / 3` from their last publish: not every app's at each change (a herd
        of 100 wakes republished every claimed app at each one's step)."""
        loop = asyncio.get_running_loop()
        every = CLAIM_TTL_S / 3
        while self._dirty or self.ledger.apps():
            now = loop.time()
            standing = self.ledger.apps()
            apps = self._dirty | {a for a in standing
                                  if now - self._published_at.get(a, -every) >= every}
            self._dirty = set()
            for app in sorted(apps):
                await self._publish(app)
            if not self._dirty:  # a change at once, else the next refresh due
                self._changed.clear()
                now = loop.time()
                wait = min((self._published_at.get(a, now) + every - now
                            for a in self.ledger.apps()), default=every)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), max(0.0, wait))

    async def _publish(self, app: str) -> bool:
        """Send the app's claims as of now; False if they did not get there. One send of an
        app at a time, each with the claims as of its turn: an older send still on its
        way (a slow connection, a retry) never lands after a newer one."""
        async with self._sends.hold(app):
            sent = self.mine(app)
            if sent == Claims():
                self._published_at.pop(app, None)
            else:
                self._published_at[app] = asyncio.get_running_loop().time()
            try:
                await self.book.publish(app, self.me, sent, CLAIM_TTL_S)
                return True
            except Exception as exc:  # others plan without ours until the next send
                log.warning("wake claims of %s could not be published: %s", app, exc)
                return False

    async def close(self) -> None:
        if self._lapses:  # (each one script: let them land, then end what has not)
            await asyncio.wait(list(self._lapses.values()), timeout=1.0)
            await cancel_and_wait(*self._lapses.values(), errors=False)
        await cancel_and_wait(self._publisher)
        for app in self.ledger.withdraw():
            with contextlib.suppress(Exception):
                await self.book.publish(app, self.me, Claims(), CLAIM_TTL_S)
