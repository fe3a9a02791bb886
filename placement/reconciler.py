"""The reconciler's shell: observe an app, ask `core.reconcile`, carry the actions out.

One entry point per app, `reconcile_app(app, lease)`, run by `placement/passes.py`
(when, and only under the app's reconcile lease: one placement at a time acts on an
app). A pass observes (the app's config and current release from the store, its
machines from the agents of live workers, the registry's records of machines on
workers that are gone), decides, and launches the actions as tasks; what they work
on is busy until they end, so a pass never issues an action twice, and an action
whose lease was lost meanwhile is not carried out. Every action ends by asking for
another pass: the loop is level-triggered and converges.

What each pass observed (the app's machines by worker and state) and the actions
it took (by action and outcome) are kept as plain counts for /metrics
(placement/metrics.py reads them when scraped); an app's go when it is deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from placement.adapters.agents import AgentClient, fenced_by
from placement.api import AppEvent
from placement.applocks import AppLocks
from placement.core import reconcile as core
from placement.core.offers import NoCapacity
from placement.core.wake import machine_release
from placement.errors import PlacementError
from placement.fleet import Fleet
from placement.leases import Lease, LeaseKeeper, LeaseStore, MemoryLeaseStore, Taken
from placement.metrics import machine_counts, outcome_class
from placement.passes import Passes, lease_name
from placement.placer import NewMachine, Placer, Round
from placement.republish import Republisher
from placement.store import AppStore
from placement.waker import Waker
from thaw.appconfig import MACHINE_FIELDS, AppConfig
from thaw.registry import Registry

log = logging.getLogger("thaw.placement")
DECLINED_FOR_S = 30.0  # a worker that declined to start a standby is not asked again soon
# A create that found no room is not tried again before this (doubling to NO_ROOM_MAX_S)
# unless the live workers change: without it a level-triggered pass retries at once,
# forever (thousands of failed offers and events a second).
NO_ROOM_FIRST_S, NO_ROOM_MAX_S = 1.0, 30.0
ROLLING_OUT = ("pending", "rolling")
LOST_RECORD_AT = 2.0**53  # a lost machine's record: newer than any its agent may publish
LEASE_TTL_S = 5.0  # an app's reconcile lease: a dead holder's apps are taken over after it


@dataclass
class AppWork:
    """What the reconciler is doing for one app."""

    busy: dict[str, str] = field(default_factory=dict)  # machine -> start|destroy|replace
    creating: Counter[bool] = field(default_factory=Counter)  # start? -> new machines
    declined: dict[str, float] = field(default_factory=dict)  # machine -> until (monotonic)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    made: list[dict[str, Any]] = field(default_factory=list)  # views of machines made
    shortfall: str = ""
    lease: Lease | None = None  # the reconcile lease its actions run under
    no_room: NoRoom | None = None  # the last create that found no room, while it stands
    workers: frozenset[str] = frozenset()  # the region's live workers at the last pass


@dataclass
class NoRoom:
    """Creates found no room among `workers`: none is tried again before `until` (loop
    time) while those are the live workers; `wait_s`: the next wait, doubled each time."""

    workers: frozenset[str]
    until: float
    wait_s: float
    retry: asyncio.TimerHandle | None = None


class Reconciler:
    def __init__(
        self, store: AppStore, fleet: Fleet, agents: AgentClient, placer: Placer,
        waker: Waker, locks: AppLocks, registry: Registry, republisher: Republisher, *,
        leases: LeaseStore | None = None, period_s: float = 5.0, drain_s: float = 1.0,
        lease_ttl_s: float = LEASE_TTL_S, clock: Callable[[], float] = time.time,
    ) -> None:
        self.store, self.fleet, self.agents, self.placer = store, fleet, agents, placer
        self.waker, self.locks, self.registry = waker, locks, registry
        self.republisher = republisher
        self.period_s = period_s
        self.drain_s = drain_s
        self.clock = clock
        self.work: dict[str, AppWork] = {}
        # for /metrics: app -> (worker, state) -> machines at its last pass, and
        # app -> (action, outcome) -> actions taken
        self.observed: dict[str, dict[tuple[str, str], int]] = {}
        self.actions: dict[str, dict[tuple[str, str], int]] = {}
        self._workers_seen: set[str] = set()  # live at the last pass: a new one asks for all
        self.keeper = LeaseKeeper(leases or MemoryLeaseStore(), lease_ttl_s)
        self.passes = Passes(self.reconcile_app, self._app_names, registry, self.keeper,
                             period_s=period_s, forget=self.forget,
                             new_worker=lambda w: w not in self._workers_seen)

    # -- triggers (placement/passes.py) ------------------------------------------------

    def start(self) -> None:
        self.passes.start()

    async def close(self) -> None:
        tasks = [t for work in self.work.values() for t in work.tasks]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.passes.close()

    def poke(self, app: str) -> None:
        """Ask for a pass over `app` (by whichever placement holds its lease)."""
        self.passes.poke(app)

    async def pass_now(self, app: str) -> bool:
        """A pass over `app` now, if this placement holds (or can take) its lease; False
        when another does (it sees the change in the registry's feed)."""
        lease = await self.keeper.acquire(lease_name(app))
        if isinstance(lease, Taken):
            return False
        await self.reconcile_app(app, lease)
        return True

    def forget(self, app: str) -> None:
        """`app` is gone: nothing of it is kept (work, observations, counts)."""
        self.work.pop(app, None)
        self.observed.pop(app, None)
        self.actions.pop(app, None)

    async def _app_names(self) -> list[str]:
        return [config.name for config in await self.store.list()]

    @property
    def live_workers(self) -> int:
        """Workers live at the last pass."""
        return len(self._workers_seen)

    async def settle(self, app: str, timeout_s: float) -> tuple[list[dict[str, Any]], str]:
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
        config = await self.store.get(app)
        work = self.work.setdefault(app, AppWork())
        work.lease = lease
        release = await self.store.release(config.uid, config.release) if config.release else None
        live = await self.fleet.live_workers()
        self._workers_seen = set(live)
        views = [v for v in await self.fleet.app_machines(app, live)
                 if v.get("app_uid", "") == config.uid]
        seen = [core.Seen(v["id"], v["worker"], v["state"], machine_release(v, config))
                for v in views]
        known = {v["id"] for v in views}
        fenced = await self.store.fenced(config.uid)
        for record in await self.registry.machines(app):
            if record.app_uid == config.uid and record.id not in known \
                    and record.worker not in live:
                seen.append(core.Seen(record.id, record.worker, record.state,
                                      machine_release(msgspec.to_builtins(record), config),
                                      live=False))
                if record.id in fenced and record.state != "lost":  # a write that failed,
                    self._spawn(app, work, self._publish_lost(config, record.id))  # or lost
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
        actions = self._room_to_create(app, work, core.reconcile(
            declared, seen, busy, fenced, region_workers))
        if actions and not await self.republisher.trusted():
            log.info("reconcile %s: the registry was just lost; waiting for the agents", app)
            return []
        if actions:
            await self._launch(config, views, actions, work)
        return actions

    def _room_to_create(self, app: str, work: AppWork,
                        actions: list[core.Action]) -> list[core.Action]:
        """`actions` without its creates while the last create found no room among these
        same workers (a pass is asked for when that wait ends)."""
        stand = work.no_room
        if stand is None:
            return actions
        if stand.workers != work.workers:  # a worker came or went: there may be room now
            if stand.retry is not None:
                stand.retry.cancel()
            work.no_room = None
            return actions
        loop = asyncio.get_running_loop()
        if loop.time() >= stand.until:
            return actions
        if stand.retry is None:
            stand.retry = loop.call_at(stand.until, self.poke, app)
        return [a for a in actions if not isinstance(a, core.Create)]

    def _found_no_room(self, work: AppWork) -> None:
        loop = asyncio.get_running_loop()
        last = work.no_room
        wait_s = NO_ROOM_FIRST_S if last is None else min(NO_ROOM_MAX_S, last.wait_s * 2)
        if last is not None and last.retry is not None:
            last.retry.cancel()
        work.no_room = NoRoom(work.workers, loop.time() + wait_s, wait_s)

    async def _launch(self, config: AppConfig, views: list[dict[str, Any]],
                actions: list[core.Action], work: AppWork) -> None:
        creates: list[core.Create | core.Replace] = []
        for action in actions:
            if isinstance(action, core.Fence):
                await self.store.fence(config.uid, action.machine, self.clock())
                await self._event(config, "fence", action.reason, action.machine)
                self._spawn(config.name, work, self._publish_lost(config, action.machine))
            elif isinstance(action, core.CompleteRelease):
                await self.store.set_release_status(config.uid, action.release, "complete",
                                                    action.reason)
                await self._event(config, "release", action.reason)
            elif isinstance(action, core.FailRelease):
                self._spawn(config.name, work, self._fail_release(config, action.reason))
            elif isinstance(action, core.Start):
                work.busy[action.machine] = "start"
                self._spawn(config.name, work, self._start(config, views, action))
            elif isinstance(action, core.Destroy):
                work.busy[action.machine] = "destroy"
                self._spawn(config.name, work, self._destroy(config, views, action))
            else:
                if isinstance(action, core.Replace):
                    work.busy[action.machine] = "replace"
                else:
                    work.creating[action.start] += 1
                creates.append(action)
        if any(isinstance(a, core.Replace) for a in actions):
            release = await self.store.release(config.uid, config.release)
            if release is not None and release.status == "pending":
                await self.store.set_release_status(config.uid, config.release, "rolling")
        if creates:
            self._spawn(config.name, work, self._create_all(config, views, creates, work))

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

    # -- actions -----------------------------------------------------------------------

    async def _start(self, config: AppConfig, views: list[dict[str, Any]],
                     action: core.Start) -> None:
        work = self.work[config.name]
        try:
            url = await self.fleet.worker_url(_worker_of(views, action.machine))
            status, body = await self._start_call(config, url, action.machine)
            if status == 409 and _code(body) == "no_capacity":
                work.declined[action.machine] = asyncio.get_running_loop().time() \
                    + DECLINED_FOR_S
            await self._event(config, "start", action.reason, action.machine,
                              _outcome(status, body))
        except PlacementError as exc:
            await self._event(config, "start", action.reason, action.machine, exc.message)
        finally:
            work.busy.pop(action.machine, None)

    async def _start_call(self, config: AppConfig, url: str, mid: str) -> tuple[int, Any]:
        return await self.fleet.start(url, mid, config.health.timeout_s, slack_s=5.0)

    async def _destroy(self, config: AppConfig, views: list[dict[str, Any]],
                       action: core.Destroy) -> None:
        work = self.work[config.name]
        try:
            status, body = await self.fleet.destroy(action.machine,
                                                    worker=_worker_of(views, action.machine))
            if status < 300 or status == 404:
                await self.store.unfence(action.machine)
            await self._event(config, "destroy", action.reason, action.machine,
                              _outcome(status, body))
        finally:
            work.busy.pop(action.machine, None)

    async def _publish_lost(self, config: AppConfig, mid: str) -> None:
        """Edges stop routing to a lost machine: its registry record says `lost`, and
        outranks anything its agent may still publish, until the machine is destroyed
        (its record deleted) when the worker comes back."""
        await self.fleet.mark(config.name, mid, "lost", LOST_RECORD_AT)

    async def _retire(self, config: AppConfig, mid: str) -> None:
        """A replaced machine takes no new request (its record says so; edges follow it)
        and has `drain_s` to finish the ones it has before it is destroyed."""
        await self.fleet.mark(config.name, mid, "replaced", self.clock())
        await asyncio.sleep(self.drain_s)

    async def _create_all(self, config: AppConfig, views: list[dict[str, Any]],
                          actions: list[core.Create | core.Replace], work: AppWork) -> None:
        """New machines, placed one after another in one market round (each avoiding the
        workers the earlier ones went to), then pulled and started side by side."""
        region = config.regions[0]
        placed_on: set[str] = set()
        starts: list[Any] = []
        try:
            rnd: Round | None = await self.placer.round(config, region, views)
        except PlacementError as exc:
            rnd = None
            work.shortfall = exc.message
        for action in actions:
            placed: NewMachine | NoCapacity | None = None
            if not self.holds(work):  # another placement has the app now: it places
                rnd = None
            if rnd is not None:
                avoid = frozenset(action.avoid | placed_on)
                placed = await self.placer.place(rnd, start=False, avoid=avoid,
                                                 spare=not action.start)
            if not isinstance(placed, NewMachine):
                reason = placed.reason if isinstance(placed, NoCapacity) else work.shortfall
                work.shortfall = reason
                if isinstance(action, core.Create):
                    self._found_no_room(work)
                self._done_creating(work, action)
                await self._event(config, _verb(action), action.reason, _old(action),
                                  f"no capacity: {reason}")
                continue
            placed_on.add(placed.worker)
            if work.no_room is not None and work.no_room.retry is not None:
                work.no_room.retry.cancel()
            work.no_room = None  # there was room: the next that finds none waits from 1 s
            note = (f"; shares worker {placed.worker}: no other worker fits"
                    if placed.worker in action.avoid else "")
            starts.append(self._bring_up(config, views, placed, action, note, rnd))
        await asyncio.gather(*starts)

    async def _bring_up(self, config: AppConfig, views: list[dict[str, Any]],
                        placed: NewMachine, action: core.Create | core.Replace, note: str,
                        rnd: Round | None) -> None:
        """Pull the image on the new machine's worker, start it if it is to run; a
        replacement that comes up takes its old machine's place (destroyed), one that
        does not fails the release."""
        work = self.work[config.name]
        mid = placed.view["id"]
        try:
            outcome, view = "ok", placed.view
            try:
                await self.fleet.pull(placed.url, rnd.image.ref if rnd else config.image)
            except PlacementError as exc:
                outcome = f"pull failed: {exc.message}"
            if outcome == "ok" and action.start:
                status, body = await self._start_call(config, placed.url, mid)
                outcome = _outcome(status, body)
                view = body if outcome == "ok" and isinstance(body, dict) else view
            if not await self.store.is_current(config):  # deleted (or made again) meanwhile
                await self.fleet.destroy(mid, url=placed.url)
                return
            work.made.append(view)
            await self._event(config, _verb(action), action.reason + note, mid, outcome)
            if isinstance(action, core.Replace):
                if outcome == "ok":
                    await self._retire(config, action.machine)
                    await self.fleet.destroy(action.machine,
                                             worker=_worker_of(views, action.machine))
                    await self._event(config, "destroy", f"replaced by {mid}", action.machine)
                else:
                    await self.fleet.destroy(mid, url=placed.url)
                    await self._fail_release(config, f"replacement {mid} of {action.machine}:"
                                                     f" {outcome}")
        finally:
            self._done_creating(work, action)

    def _done_creating(self, work: AppWork, action: core.Create | core.Replace) -> None:
        if isinstance(action, core.Replace):
            work.busy.pop(action.machine, None)
        else:
            work.creating[action.start] -= 1

    async def _fail_release(self, config: AppConfig, reason: str) -> None:
        """The release being rolled out failed: the app goes back to the last complete
        release before it (its machine fields; no new release), and keeps serving on it."""
        async with self.locks.hold(config.name):
            current = await self.store.get(config.name)
            if current.uid != config.uid or current.release != config.release:
                return  # changed meanwhile (a new deploy, a rollback): nothing to undo
            back = next((r for r in await self.store.releases(current.uid)
                         if r.version < current.release and r.status == "complete"), None)
            restored = None
            if back is not None:
                fields = {name: getattr(back.config, name) for name in MACHINE_FIELDS}
                restored = msgspec.structs.replace(current, **fields, release=back.version)
            stored = await self.store.set_release_status(current.uid, current.release,
                                                         "failed", reason, config=restored)
            if stored is not None:
                await self.registry.put_app(stored)
        where = f"back to release {back.version}" if back else "no earlier release to go to"
        await self._event(config, "release",
                          f"release {config.release} failed ({reason}); {where}")

    async def _event(self, config: AppConfig, action: str, reason: str, machine: str = "",
                     outcome: str = "ok") -> None:
        log.info("reconcile %s: %s %s: %s (%s)", config.name, action, machine or "-", reason,
                 outcome)
        counts = self.actions.setdefault(config.name, {})
        key = (action, outcome_class(outcome))
        counts[key] = counts.get(key, 0) + 1
        await self.store.add_event(config.uid, AppEvent(self.clock(), action, reason, machine,
                                                        outcome))


def _worker_of(views: list[dict[str, Any]], mid: str) -> str:
    return next((v["worker"] for v in views if v["id"] == mid), "")


def _verb(action: core.Create | core.Replace) -> str:
    return "replace" if isinstance(action, core.Replace) else "create"


def _old(action: core.Create | core.Replace) -> str:
    return action.machine if isinstance(action, core.Replace) else ""


def _code(body: Any) -> str:
    return str(body.get("error", "")) if isinstance(body, dict) else ""


def _outcome(status: int, body: Any) -> str:
    if 200 <= status < 300:
        return "ok"
    message = body.get("message", body) if isinstance(body, dict) else body
    return f"{status or 'unreachable'}: {message}"
