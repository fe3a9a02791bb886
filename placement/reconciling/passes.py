"""When the reconciler looks at an app, and whether this placement is the one to.

Passes over an app are asked for (`poke`, or `pass_now` to wait for one) by change:
app changes and deploys, the registry's change feed (an app's or a machine's change:
that app, whichever placement made it; a new worker: every app; a machine's change
while a wake of its app runs here: one pass when that wake ends), the end of an
action, a worker gone silent (the apps that had machines on it), and the look again
an unsettled app asks for. Idle costs what changes, not apps x time: besides, one
slow sweep looks at every app at a bounded rate (placement/core/sweep.py), in case
something was missed. One pass at a time per app, whoever asked; one asked for while
one runs runs after it.

Several placements may share a platform: a pass runs only under the app's
reconcile lease (`reconcile:APP`, placement/leases.py), so exactly one placement
acts on an app at a time. A placement that finds the lease taken watches it (the
leases of every such app in one call, every `WATCH_TAKEN_S`) and asks for a pass
once it is free, so a dead holder is replaced within about the lease's TTL; a live
holder renews it and keeps the app while it is busy (no flapping between placements
mid-work), and gives it back once the app has been quiet for `GIVE_BACK_AFTER_S`:
renewals cost what is under way, not every app a placement ever looked at.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ground.registry import Change, Registry
from ground.registry.follow import Position, follow
from ground.registry.types import WORKERS
from ground.tasks import cancel_and_wait
from placement.core.sweep import sweep_gap_s
from placement.errors import NotFound, PlacementError
from placement.leases import LeaseKeeper
from placement.ports.leases import Lease, Taken

log = logging.getLogger("thaw.placement")
WATCH_TAKEN_S = 1.0  # how often the leases other placements hold are checked for lapse
GIVE_BACK_AFTER_S = 30.0  # an app's lease is given back once it has been quiet this long
PASSES_AT_ONCE = 16  # passes over different apps running together (the others queue)


@dataclass
class AppPasses:
    passing: bool = False
    again: bool = False
    retry: asyncio.TimerHandle | None = None  # a look again asked for
    give_back: asyncio.TimerHandle | None = None  # the lease of a quiet app
    # pass_now's callers: each is answered by the end of the next pass to begin
    waiting: list[asyncio.Future[bool]] = field(default_factory=list)


def lease_name(app: str) -> str:
    return f"reconcile:{app}"


class Passes:
    def __init__(
        self, run: Callable[[str, Lease], Awaitable[bool]],
        apps: Callable[[], Awaitable[list[str]]], registry: Registry, keeper: LeaseKeeper,
        *, period_s: float, new_worker: Callable[[str], bool],
        forget: Callable[[str], None],
        gone_workers: Callable[[], Awaitable[list[str]]] | None = None,
        busy: Callable[[str], bool] = lambda _: False,
        waking: Callable[[str], bool] = lambda _: False,
        give_back_after_s: float = GIVE_BACK_AFTER_S,
    ) -> None:
        """`run(app, lease)`: one pass, True when the app is not settled (something was
        to do: look again after `period_s` even if nothing changes); `apps()`: every
        app's name (the store); `new_worker(id)`: a worker not seen live at the last
        pass; `forget(app)`: the app is gone (a pass found no such app);
        `gone_workers()`, asked every `period_s`: the apps that had machines on a
        worker that stopped being live since the last call; `busy(app)`: work of the
        app's is under way (its lease is kept); `waking(app)`: a wake of the app runs
        here now (its machines' changes in the feed ask for one pass when a wake of it
        ends, `woken`)."""
        self.run, self.apps, self.registry, self.keeper = run, apps, registry, keeper
        self.period_s = period_s
        self.new_worker = new_worker
        self.forget_app = forget
        self.gone_workers = gone_workers
        self.busy = busy
        self.waking = waking
        self.deferred: set[str] = set()  # machine changes seen while a wake ran here
        self.give_back_after_s = give_back_after_s
        self.state: dict[str, AppPasses] = {}
        self.taken: set[str] = set()  # apps whose lease another placement holds
        self.tasks: set[asyncio.Task[None]] = set()
        self.position: str | None = None  # in the routes feed (None: from the start)
        self.workers_position = Position()  # in the workers' feed
        self._everything_after = 0.0  # loop time: a missed change asks for every app
        # every app asked for at once (a start, a new worker, a missed change) must not
        # run 10,000 passes together: they would drain the store's and Redis's pools
        self._slots = asyncio.Semaphore(PASSES_AT_ONCE)
        self._loops: list[asyncio.Task[None]] = []
        self._closed = False  # no pass is asked for once closing (a wake may end later)

    def start(self) -> None:
        self._loops = [asyncio.create_task(loop()) for loop in (
            self._first_and_sweeps, self._feed, self._worker_feed, self._watch_taken,
            self._workers)]

    async def close(self) -> None:
        self._closed = True
        self.deferred.clear()
        for state in self.state.values():
            for timer in (state.retry, state.give_back):
                if timer is not None:
                    timer.cancel()
        await cancel_and_wait(*self._loops, *self.tasks, errors=False)
        await self.keeper.close()

    def poke(self, app: str) -> None:
        if self._closed:
            return
        state = self.state.setdefault(app, AppPasses())
        if state.passing:
            state.again = True
            return
        state.passing = True
        task = asyncio.create_task(self._passes(app, state))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def pass_now(self, app: str) -> bool:
        """Wait for a pass over `app` that begins after this call (the one running now,
        if any, may have observed too early): True if this placement held the lease and
        ran it, False if another holds it (that one sees the change in the feed). The
        pass is the guarded one every other trigger asks for, so no two overlap."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.state.setdefault(app, AppPasses()).waiting.append(done)
        self.poke(app)
        return await done

    async def forget(self, app: str) -> None:
        """`app` is deleted: no more passes, and its lease goes back at once."""
        state = self.state.pop(app, None)
        self.taken.discard(app)
        self.deferred.discard(app)
        if state is not None:
            for timer in (state.retry, state.give_back):
                if timer is not None:
                    timer.cancel()
            _answer(state.waiting, False)
        await self.keeper.release(lease_name(app))

    async def _passes(self, app: str, state: AppPasses) -> None:
        try:
            while True:
                state.again = False
                waiting, state.waiting = state.waiting, []
                ran = False
                try:
                    async with self._slots:
                        ran = await self._one(app, state)
                finally:
                    _answer(waiting, ran)
                if not ran or not state.again:
                    return
        finally:
            state.passing = False
            _answer(state.waiting, False)  # cancelled, or the pass found the app gone

    async def _one(self, app: str, state: AppPasses) -> bool:
        """One pass, if this placement holds the app's lease; False: it did not run (the
        lease is another's or unavailable, or the app is gone), no more passes now."""
        try:
            lease = await self.keeper.acquire(lease_name(app))
        except PlacementError as exc:
            log.warning("reconcile %s: lease unavailable: %s", app, exc.message)
            self._look_again(app, state)
            return False
        if isinstance(lease, Taken):
            self.taken.add(app)
            return False
        self.taken.discard(app)
        if state.give_back is not None:
            state.give_back.cancel()
            state.give_back = None
        try:
            unsettled = await self.run(app, lease)
        except NotFound:
            self.forget_app(app)
            await self.forget(app)
            return False
        except Exception:
            log.exception("reconcile pass over app %s failed", app)
            unsettled = True
        if unsettled:
            self._look_again(app, state)
        elif not self.busy(app):
            state.give_back = asyncio.get_running_loop().call_later(
                self.give_back_after_s, self._give_back, app, state)
        return True

    def _give_back(self, app: str, state: AppPasses) -> None:
        """A quiet app's lease goes back: idle apps cost no renewals, and whichever
        placement sees the next change takes it (its pass is the next after it)."""
        state.give_back = None
        if state.passing or self.busy(app) or self.state.get(app) is not state:
            return  # a pass under way, or work: the pass after it asks again
        task = asyncio.create_task(self.keeper.release(lease_name(app)))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _look_again(self, app: str, state: AppPasses) -> None:
        """A pass over `app` in `period_s`, whatever changes meanwhile (one at most)."""
        if state.retry is None or state.retry.cancelled() \
                or state.retry.when() <= asyncio.get_running_loop().time():
            state.retry = asyncio.get_running_loop().call_later(self.period_s, self.poke, app)

    async def _first_and_sweeps(self) -> None:
        """Every app at once when this placement starts (it may have missed anything),
        then every app again, a few a second (core/sweep.py), forever."""
        first = True
        while True:
            try:
                names = await self.apps()
            except PlacementError as exc:  # the store is away: try again a bit later
                log.warning("reconciler: %s", exc.message)
                await asyncio.sleep(self.period_s)
                continue
            if first:
                for name in names:
                    self.poke(name)
                first = False
                await asyncio.sleep(self.period_s)
                continue
            gap_s = sweep_gap_s(len(names))
            for name in names:
                await asyncio.sleep(gap_s)
                self.poke(name)
            if not names:
                await asyncio.sleep(gap_s)

    async def _watch_taken(self) -> None:
        """The apps another placement holds, in one call every `WATCH_TAKEN_S`: a lease
        that lapsed (its holder died, or gave it back) asks for a pass here."""
        while True:
            await asyncio.sleep(WATCH_TAKEN_S)
            names = sorted(self.taken)
            if not names:
                continue
            try:
                free = await self.keeper.free(names)
            except Exception as exc:  # the registry is away: the next check tries again
                log.warning("reconciler: leases not checked: %s", exc)
                continue
            for name in free:
                self.taken.discard(name)
                self.poke(name)

    async def _workers(self) -> None:
        """A worker gone silent writes nothing to the feed: its apps are looked at."""
        if self.gone_workers is None:
            return
        while True:
            await asyncio.sleep(self.period_s)
            try:
                apps = await self.gone_workers()
            except Exception as exc:  # the registry is away: the next check tries again
                log.warning("reconciler: workers not checked: %s", exc)
                continue
            for name in apps:
                self.poke(name)

    async def _feed(self) -> None:
        """An app's or a machine's change (the routes feed) asks for a pass over that app;
        a new worker's (the workers' feed, `_worker_feed`), over every app. After a feed
        error it resumes where it was, and every app is looked at (a change may have been
        missed; at most once per `period_s`)."""
        await follow(self.registry, self, self._seen, self._missed, "reconciler")

    async def _worker_feed(self) -> None:
        """A new worker's heartbeat asks for a pass over every app (the workers' feed)."""
        await follow(self.registry, self.workers_position, self._seen, self._missed,
                     "reconciler (workers)", feed=WORKERS)

    def woken(self, app: str) -> None:
        """A wake of `app` here ended: one pass if its machines changed while it ran (so a
        change waits at most for the wake it came during: a wake answers by its
        deadline)."""
        if app in self.deferred:
            self.deferred.discard(app)
            self.poke(app)

    async def _seen(self, change: Change) -> None:
        if change.kind == "machine":
            app = change.key.split("/", 1)[0]
            if self.waking(app):
                # A wake here is starting the app's machines: a pass now would find them
                # claimed (busy) and do nothing, at the price of its reads (a herd of 200
                # wakes made ~2.7 passes each); one pass when the wake ends sees where it
                # ended. Any machine of the app waits so (a crash beside a wake is seen
                # once it answers).
                self.deferred.add(app)
            else:
                self.poke(app)
        elif change.kind == "app":  # changed or deployed, maybe through another placement
            self.poke(change.key)
        elif change.kind == "worker" and self.new_worker(change.key):
            for name in await self.apps():
                self.poke(name)

    async def _missed(self) -> None:
        now = asyncio.get_running_loop().time()
        if now < self._everything_after:
            return
        self._everything_after = now + self.period_s
        for name in await self.apps():
            self.poke(name)


def _answer(waiting: list[asyncio.Future[bool]], ran: bool) -> None:
    for done in waiting:
        if not done.done():
            done.set_result(ran)
    waiting.clear()
