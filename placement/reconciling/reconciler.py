"""The reconciler's shell: observe an app, ask `core.reconcile`, have the actions carried
out (placement/reconciling/appactions.py).

One entry point per app, `reconcile_app(app, lease)`, run by `placement/reconciling/passes.py`
only (when, one pass at a time per app whatever asked — `pass_now` waits for one — and
only under the app's reconcile lease: one placement at a time acts on an app). A pass
observes (the app's config and current release from the store, its machines from the
agents of live workers, the registry's records of machines on workers that are gone),
decides, and launches the actions as tasks; what they work on is busy until they end,
so a pass never issues an action twice, and an action whose lease was lost meanwhile
is not carried out. Every action ends by asking for another pass, and a pass that
found something to do asks for another soon: the loop is level-triggered and converges.

What each pass observed (the app's machines by worker and state) and the actions
it took (by action and outcome) are kept as plain counts for /metrics
(placement/metrics.py reads them when scraped); an app's go when it is deleted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from agent.api import MachineView
from ground.registry import Registry
from ground.tasks import cancel_and_wait
from placement.adapters.agents import fenced_by
from placement.adapters.memory import MemoryLeaseStore
from placement.applocks import AppLocks
from placement.core import reconcile as core
from placement.core import sweep
from placement.core.releases import ROLLING_OUT
from placement.core.wake import machine_release
from placement.fleet.fleet import Fleet
from placement.fleet.republish import Republisher
from placement.leases import LeaseKeeper
from placement.metrics import machine_counts
from placement.placer import Placer
from placement.ports.leases import Lease, LeaseStore
from placement.reconciling.appactions import AppActions, AppWork
from placement.reconciling.passes import Passes
from placement.store import AppStore
from placement.wakes.waker import Waker

log = logging.getLogger("thaw.placement")
LEASE_TTL_S = 5.0  # an app's reconcile lease: a dead holder's apps are taken over after it


class Reconciler:
    def __init__(
        self, store: AppStore, fleet: Fleet, placer: Placer,
        waker: Waker, locks: AppLocks, registry: Registry, republisher: Republisher, *,
        leases: LeaseStore | None = None, period_s: float = 5.0, drain_s: float = 1.0,
        lease_ttl_s: float = LEASE_TTL_S, clock: Callable[[], float] = time.time,
    ) -> None:
        self.store, self.fleet, self.placer = store, fleet, placer
        self.waker, self.locks, self.registry = waker, locks, registry
        self.republisher = republisher
        self.period_s = period_s
        self.drain_s = drain_s
        self.clock = clock
        self.work: dict[str, AppWork] = {}
        # for /metrics: app -> (worker, state) -> machines at its last pass, and
        # app -> (action, outcome) -> actions taken
        self.observed: dict[str, dict[tuple[str, str], int]] = {}
        self.acts = AppActions(store, fleet, placer, registry, locks, self.work,
                               spawn=self._spawn, holds=self.holds, clock=clock,
                               drain_s=drain_s)
        self.actions = self.acts.counts
        self._workers_seen: set[str] = set()  # live at the last pass: a new one asks for all
        self._workers_watched: set[str] = set()  # live at the last look for gone ones
        self.keeper = LeaseKeeper(leases or MemoryLeaseStore(), lease_ttl_s)
        self.passes = Passes(self._pass, self._app_names, registry, self.keeper,
                             period_s=period_s, forget=self.forget,
                             new_worker=lambda w: w not in self._workers_seen,
                             gone_workers=self._apps_on_gone_workers, busy=self._busy,
                             waking=waker.waking)
        waker.woken = self.passes.woken

    # -- triggers (placement/reconciling/passes.py) ------------------------------------------------

    def start(self) -> None:
        self.passes.start()

    async def close(self) -> None:
        await cancel_and_wait(*[t for work in self.work.values() for t in work.tasks],
                              errors=False)
        await self.passes.close()

    def poke(self, app: str) -> None:
        """Ask for a pass over `app` (by whichever placement holds its lease)."""
        self.passes.poke(app)

    async def pass_now(self, app: str) -> bool:
        """Wait for a pass over `app` that begins now or after the one running, through the
        same one-at-a-time guard as every other pass: True if this placement held (or
        took) the lease, False when another does (it sees the change in the feed)."""
        return await self.passes.pass_now(app)

    def forget(self, app: str) -> None:
        """`app` is gone: nothing of it is kept (work, observations, counts)."""
        self.work.pop(app, None)
        self.observed.pop(app, None)
        self.actions.pop(app, None)

    async def _app_names(self) -> list[str]:
        return [config.name for config in await self.store.list()]

    async def _pass(self, app: str, lease: Lease) -> bool:
        """One pass (Passes runs it); True: look again soon even if nothing changes (it
        found something to do, maybe held back, or machines declined for a while)."""
        await self.reconcile_app(app, lease)
        work = self.work.get(app)
        return work is not None and (work.unsettled or bool(work.declined))

    def _busy(self, app: str) -> bool:
        """Actions of the app's under way, or a wait for room that will ask again."""
        work = self.work.get(app)
        return work is not None and (bool(work.tasks) or work.no_room_retry is not None)

    async def _apps_on_gone_workers(self) -> list[str]:
        """The apps with machines (at their last pass) on workers live at the last call
        that are no longer: a dead host's heartbeats just stop."""
        live = await self.fleet.live_workers()
        gone, apps = sweep.on_gone_workers(self.observed, self._workers_watched, live)
        self._workers_watched = set(live)
        if gone:
            log.info("workers %s no longer live: %d apps looked at", ", ".join(sorted(gone)),
                     len(apps))
        return apps

    @property
    def live_workers(self) -> int:
        """Workers live at the last pass."""
        return len(self._workers_seen)

    async def settle(self, app: str, timeout_s: float) -> tuple[list[MachineView], str]:
        """Wait (at most `timeout_s`) for what the reconciler is doing to `app`; the views
        of the machines it made meanwhile and why any could not be made."""
        work = self.work.get(app)
        if work is None:
            return [], ""
        work.made, work.shortfall = [], ""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while work.tasks:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                break
            await asyncio.wait(list(work.tasks), timeout=remaining)
        return list(work.made), work.shortfall

    # -- one pass ----------------------------------------------------------------------

    async def reconcile_app(self, app: str, lease: Lease) -> list[core.Action]:
        """Observe `app`, decide, and launch the actions (not waiting for them), under
        `lease` (this placement's reconcile lease of the app)."""
        if self.republisher.refill is not None:
            # The registry is being filled again: what a pass would observe may lack
            # workers not back yet, and it would act on nothing (not even cost the
            # registry a read: 2,000 apps' passes at once ran its pool dry). The timer's
            # pass over every app comes after the refill.
            return []
        refills = self.republisher.refills
        config = await self.store.get(app)
        work = self.work.setdefault(app, AppWork())
        work.lease = lease
        release = await self.store.release(config.uid, config.release) if config.release else None
        live, standing = await self.fleet.standing_workers()
        self._workers_seen = set(live)
        views = [v for v in await self.fleet.app_machines(app, standing)
                 if v.app_uid == config.uid]
        records = [r for r in await self.fleet.sealed_machines(app) if r.app_uid == config.uid]
        fenced = await self.store.fenced(config.uid)
        # a fenced machine's `lost` record keeps the epoch its worker had when it was lost
        lost_under = {r.id: r.epoch for r in records if r.state == "lost"}
        epochs = {w: s.epoch for w, s in standing.items()}
        seen = [core.Seen(v.id, v.worker, v.state, machine_release(v, config),
                          reason=last_reason(v), same_epoch=v.id in fenced
                          and lost_under.get(v.id, -1) == epochs.get(v.worker),
                          for_spares=v.for_spares)
                for v in views]
        known = {v.id for v in views}
        await self.acts.note_ends(config, work, views)
        for record in records:
            # a machine its agent did not report: on a standing worker (in doubt, its agent
            # silent) as last seen, unless fenced or lost; elsewhere, lost with its worker
            standing_worker = record.worker in standing
            if record.id in known or (standing_worker and (record.id in fenced
                                                           or record.state == "lost")):
                continue
            seen.append(core.Seen(record.id, record.worker, record.state,
                                  machine_release(record, config),
                                  live=standing_worker))
            if not standing_worker and record.id in fenced and record.state != "lost":
                # a write that failed, or lost
                self._spawn(app, work, self.acts.publish_lost(config, record.id))
        self.observed[app] = machine_counts(seen)
        now = asyncio.get_running_loop().time()
        work.declined = {m: t for m, t in work.declined.items() if t > now}
        wakes = await self.waker.claims.everyone(app)  # every placement's wakes
        claimed = wakes.starting
        busy = core.Busy(
            machines=frozenset(work.busy) | frozenset(work.declined) | frozenset(claimed),
            starting=frozenset(m for m, k in work.busy.items() if k == "start")
            | frozenset(claimed),
            destroying=frozenset(m for m, k in work.busy.items() if k == "destroy"),
            creating_running=work.creating[True] + wakes.placing,
            creating_standby=work.creating[False],
            replacing=sum(1 for k in work.busy.values() if k == "replace"),
        )
        region = config.regions[0]
        declared = core.Declared(
            release=config.release, min_running=config.min_machines_running,
            spares=config.spares, max_machines=config.max_machines,
            strategy=release.strategy if release else config.deploy.strategy,
            max_unavailable=config.deploy.max_unavailable,
            rolling_out=release is not None and release.status in ROLLING_OUT,
        )
        region_workers = [w for w, s in live.items() if s.region == region]
        work.workers = frozenset(region_workers)
        decided = core.reconcile(declared, seen, busy, fenced, region_workers)
        work.unsettled = bool(decided)
        actions = self._room_to_create(app, work, decided)
        if actions and not await self.republisher.trusted():
            log.info("reconcile %s: the registry was lost; waiting for the workers to "
                     "publish again", app)
            return []
        if actions and self.republisher.refills != refills:
            self.poke(app)  # it observed before a refill (maybe half a view): look again
            return []
        if actions:
            await self.acts.launch(config, views, actions, work)
        return actions

    def _room_to_create(self, app: str, work: AppWork,
                        actions: list[core.Action]) -> list[core.Action]:
        """`actions` without its creates while the last create that found no room holds
        them back, and without creates and replacements while new machines keep failing
        to come up (core.creates_held_back: 1 s, doubling to 30 s; else a release that
        cannot start, with nothing to roll back to, creates and fails machines as fast as
        the host can); a pass is asked for when the wait ends."""
        held = core.held_back(work.no_room, work.failing, work.workers,
                              asyncio.get_running_loop().time())
        if held is None:
            return actions
        if work.no_room_retry is None or work.no_room_retry.cancelled():
            work.no_room_retry = asyncio.get_running_loop().call_at(
                held.until, self._no_room_over, app, work)
        kinds = (core.Create, core.Replace) if held.replacements else (core.Create,)
        return [a for a in actions if not isinstance(a, kinds)]

    def _no_room_over(self, app: str, work: AppWork) -> None:
        work.no_room_retry = None
        self.poke(app)

    def _spawn(self, app: str, work: AppWork, coro: Any) -> None:
        async def run() -> None:
            try:
                if not self.holds(work) or work.lease is None:
                    coro.close()
                    log.warning("reconcile %s: lease lost; its pending actions dropped", app)
                    work.busy.clear()
                    work.creating.clear()
                    return
                with fenced_by(work.lease.token):  # the agents refuse it once it is stale
                    await coro
            except Exception:
                log.exception("reconcile action for app %s failed", app)
            finally:
                self.poke(app)  # level-triggered: look again once something changed

        task = asyncio.create_task(run())
        work.tasks.add(task)
        task.add_done_callback(work.tasks.discard)

    def holds(self, work: AppWork) -> bool:
        """This placement still holds the lease the app's work was started under."""
        return work.lease is not None and self.keeper.valid(work.lease)


def last_reason(view: MachineView) -> str:
    """The reason of a machine view's last event ("" if none)."""
    return view.events[-1].reason if view.events else ""
