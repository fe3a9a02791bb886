"""Placement's side of registry loss: publish every app again under a new generation.

The apps' truth is placement's store; the registry holds copies. When the registry
answers a generation other than the one placement last published under (Redis came
back empty, or was flushed), every stored app is published again: one read of the
store, written in batches (`Registry.put_apps`, a few round trips for thousands of
apps), then checked against a second read (an app deleted or made again meanwhile is
put right one by one, under its lock).

The reconciler, meanwhile, holds off acting (`trusted()`), and wakes are held: until
the agents, which notice the same change on their next heartbeat, have published their
workers and machines again, an empty view would look like lost machines to replace. It
waits for every worker live before the loss to say, in its heartbeat, that it has
published under the new generation, or for `bound_s` (placement/core/refill.py). Then
the view is whole again and placement marks it so (`mark_republished`): the edges keep
their view, adding and never removing, until that marker names the current generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from ground.appconfig import AppConfig
from ground.registry import Registry, WorkerStatus
from ground.registry.generation import GenerationWatch
from ground.tasks import cancel_and_wait
from placement.applocks import AppLocks
from placement.core import refill as rule
from placement.errors import NotFound
from placement.store import AppStore

log = logging.getLogger("thaw.placement")

# A loss is detected, not polled: a connection to the registry made again (Redis
# restarted: the change feed's blocked read reconnects at once) starts a check, and so
# does a worker's heartbeat naming another generation (the agents hear a new one in
# their heartbeats' answers: a flush, which breaks no connection), and every reconciler
# pass and wake that acts (`trusted`, `wait_trusted`). A timer is only the net, and
# tries again what failed.
SAFETY_CHECK_S = 10.0
RETRY_S = 1.0  # a check that failed, and apps whose publish failed, are tried again
REFILL_POLL_S = 0.1  # how often, during a refill, the workers' heartbeats are read
REMEMBERED_S = 30.0  # a worker seen live this recently is awaited after a loss
PUBLISH_BATCH = 500  # apps handed to one put_apps (it splits them in round trips itself)


class Republisher:
    def __init__(self, registry: Registry, store: AppStore, locks: AppLocks, bound_s: float,
                 live_workers: Callable[[], Awaitable[Iterable[str]]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`bound_s`: the longest the reconciler waits for the agents after a loss;
        `live_workers`: the workers live now (their ids), remembered at each check so
        that a loss knows whom to wait for (None: wait for nobody but the bound); the
        heartbeats the fleet index reads from the feed are remembered as they come
        (`heard`)."""
        # a connection the shared client makes again (the feed's, first) starts a check
        self._sign = asyncio.Event()
        self._check_failed = False
        registry.on_connect(self._sign.set)
        # on connections of its own: a refill must not wait behind every app's pass for
        # one (at 2,000 apps they ran the shared pool dry for 30 s after a restart)
        self.registry = registry.with_own_connections()
        self._own_registry = self.registry is not registry
        self.store, self.locks = store, locks
        self.bound_s = bound_s
        self.live_workers = live_workers
        self.clock = clock
        self.watch = GenerationWatch()
        self.seen_live: dict[str, float] = {}  # worker -> when last seen live (clock)
        self.refill: rule.Refill | None = None  # a loss whose agents are awaited
        self.refills = 0  # refills begun: a pass that observed before one must not act
        self.whole = asyncio.Event()  # set while no refill is under way
        self.whole.set()
        self.owed: set[str] = set()  # apps stored whose copy could not be published yet
        self._lock = asyncio.Lock()
        # calls of `check` so far, and how many of them the last check that ended covers
        # (every call made before its read began), with its answer
        self._asked = self._covered = self._answer = 0
        self._task: asyncio.Task[None] | None = None

    async def check(self) -> int:
        """Read the generation; under a new one, publish every app again (how many).
        One check at a time, each read made after the calls it answers: callers that
        asked while one ran are answered together by the next one (each wake asks: a
        herd of 200 read the generation 200 times one after another), never by one
        whose read may predate their call (it could have missed a loss)."""
        self._asked += 1
        mine = self._asked
        async with self._lock:
            if self._covered >= mine:  # a check that began after this call has ended
                return self._answer
            covers = self._asked
            self._answer = await self._check()
            self._covered = covers
            return self._answer

    async def _check(self) -> int:
        token = await self.registry.generation()
        if token == self.watch.known:
            return 0
        if self.watch.lost(token):
            live_before = self.live_before()
            log.warning("the registry was lost (new generation): publishing every app "
                        "again; the reconciler waits for %d workers (at most %.0f s)",
                        len(live_before), self.bound_s)
            self.refill = rule.begin(token, self.clock(), live_before)
            self.refills += 1
            self.whole.clear()
            self._sign.set()  # (seen by a pass or a wake: the loop now follows the refill)
        began = time.perf_counter()
        published = await self._publish_all()
        if self.refill is None:  # (a failed mark publishes again at the next check)
            await self.registry.mark_republished(token)
        self.watch.published(token)
        if self.refill is not None:
            log.warning("%d apps published again in %.2f s", published,
                        time.perf_counter() - began)
        return published

    async def trusted(self) -> bool:
        """Whether the registry's view may be acted on now: not lost, or lost and filled
        again (every worker live before the loss republished, or the bound passed)."""
        await self.check()
        refill = self.refill
        if refill is None:
            return True
        published = {w.id: w.generation for w in await self.registry.workers()}
        if not rule.over(refill, published, self.clock(), self.bound_s):
            return False
        if self.refill is not refill:  # another caller ended it meanwhile
            return True
        self.refill = None
        try:
            await self.registry.mark_republished(refill.generation)
        except Exception:
            self.refill = refill  # marked at a later call
            raise
        self.whole.set()
        missing = rule.still_awaited(refill, published)
        if missing:
            log.warning("registry refill: acting again without workers %s (not back after "
                        "%.0f s)", ", ".join(sorted(missing)), self.bound_s)
        else:
            log.warning("registry refill: every worker is back after %.2f s",
                        self.clock() - refill.began)
        return True

    async def wait_trusted(self, until: float) -> bool:
        """Wait until no refill is under way, at most until `until` (loop time); whether
        none is. What a wake does during a refill: held within its budget, not answered
        `no_capacity` because the workers and machines it would start are not back in
        the view yet. (A refill is ended by the check loop, not by its waiters.)"""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(until):
                await self.check()
                await self.whole.wait()
                return True
        return False

    async def _remember_live(self) -> None:
        """Note the workers live now: those a loss will wait for (right after a check
        that found no loss)."""
        if self.refill is None and self.live_workers is not None:
            now = self.clock()
            for worker in await self.live_workers():
                self.seen_live[worker] = now

    def live_before(self) -> list[str]:
        """The workers seen live in the last `REMEMBERED_S` (one that looked stale at the
        very last look is still awaited; one gone for long is not)."""
        since = self.clock() - REMEMBERED_S
        self.seen_live = {w: at for w, at in self.seen_live.items() if at >= since}
        return list(self.seen_live)

    async def _publish_all(self) -> int:
        """Every stored app, in batches; then what changed meanwhile, one by one."""
        configs = await self.store.list()
        for start in range(0, len(configs), PUBLISH_BATCH):
            await self.registry.put_apps(configs[start:start + PUBLISH_BATCH])
        published = {config.name: config for config in configs}
        now = {config.name: config for config in await self.store.list()}
        for name in published.keys() | now.keys():
            if not same(published.get(name), now.get(name)):
                await self._publish_one(name)
        return len(now)

    async def publish(self, config: AppConfig) -> None:
        """Publish an app just stored (its lock held by the caller). The store is the
        truth and has it: a registry that does not answer (away, or its pool dry) does
        not fail the owner's call, which would be told "unavailable" about an app that
        exists (and get 409 on a retry), and leave it unknown to every edge until the
        next loss. The app is owed instead, published again every check until it is."""
        try:
            await self.registry.put_app(config)
        except Exception as exc:
            log.warning("app %s stored but not published yet (tried again): %s",
                        config.name, exc)
            self.owed.add(config.name)
        else:
            self.owed.discard(config.name)

    async def _pay_owed(self) -> None:
        """Publish the apps owed, as the store holds them now (one at a time, each under
        its lock); one that fails again stays owed."""
        for name in sorted(self.owed):
            await self._publish_one(name)
            self.owed.discard(name)

    async def _publish_one(self, name: str) -> None:
        """`name` as the store holds it now, under its lock (not racing a delete or an
        update); an app made again under its name may have a lower version than the copy
        just written: that copy goes first."""
        async with self.locks.hold(name):
            try:
                current: AppConfig | None = await self.store.get(name)
            except NotFound:
                current = None
            copy = await self.registry.app(name)
            if copy is not None and (current is None or copy.uid != current.uid):
                await self.registry.delete_app(name)
            if current is not None:
                await self.registry.put_app(current)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        if self._own_registry:
            await self.registry.close()

    def heard(self, status: WorkerStatus) -> None:
        """A worker's heartbeat, as the fleet index reads it from the feed. The worker is
        live: one a loss will wait for. And the agents hear a new generation in their
        heartbeats' answers, at once: a heartbeat naming another generation than the one
        published under is a sign to check (a flush breaks no connection)."""
        if self.refill is None and not status.draining:
            self.seen_live[status.id] = self.clock()
        if self.watch.known is not None and status.generation \
                and status.generation != self.watch.known:
            self._sign.set()

    async def _next_check(self) -> None:
        """Until the next check: a sign that the registry may have been lost (a
        connection made again), or the safety timer; during a refill, the next look at
        the workers' heartbeats."""
        if self.refill is not None:
            await asyncio.sleep(REFILL_POLL_S)
            return
        soon = self.owed or self._check_failed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(RETRY_S if soon else SAFETY_CHECK_S):
                await self._sign.wait()
        self._sign.clear()

    async def _run(self) -> None:
        while True:
            await self._next_check()
            try:
                if self.refill is not None:
                    await self.trusted()  # marks the refill done once it is
                await self.check()
                await self._pay_owed()
                await self._remember_live()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the registry is away: tried again soon
                self._check_failed = True
                log.debug("registry generation check failed: %s", exc)
            else:
                self._check_failed = False


def same(a: AppConfig | None, b: AppConfig | None) -> bool:
    return (a is None and b is None) or (
        a is not None and b is not None and a.uid == b.uid and a.version == b.version)
