"""What the reconciler's actions do: start, destroy, create, replace, fence, roll back.

`AppActions.launch` carries out one pass's actions for an app (placement/reconciling/reconciler.py
decides them with `core.reconcile`): each runs as a task through the reconciler's
`spawn`, which drops it when the app's reconcile lease was lost meanwhile and makes
the agents' calls carry the lease's fencing token. What an action works on stays busy
in the app's `AppWork` until it ends. Every action is recorded as an app event and
counted by (action, outcome) for /metrics.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import msgspec

from agent.api import MachineView
from ground.appconfig import ROLLBACK_FIELDS, AppConfig
from ground.registry import Registry
from placement.api import AppEvent
from placement.applocks import AppLocks
from placement.core import reconcile as core
from placement.core.ends import new_ends
from placement.core.offers import NoCapacity
from placement.core.releases import going_back_to
from placement.errors import PlacementError
from placement.fleet.fleet import Fleet
from placement.metrics import outcome_class
from placement.placer import NewMachine, Placer, Round
from placement.ports.leases import Lease
from placement.ports.workers import Refused, Unreachable
from placement.store import AppStore

log = logging.getLogger("thaw.placement")
DECLINED_FOR_S = 30.0  # a worker that declined to start a standby is not asked again soon
LOST_RECORD_AT = 2.0**53  # a lost machine's record: newer than any its agent may publish
Spawn = Callable[[str, "AppWork", Coroutine[Any, Any, None]], None]


@dataclass
class AppWork:
    """What the reconciler is doing for one app."""

    busy: dict[str, str] = field(default_factory=dict)  # machine -> start|destroy|replace|create
    creating: Counter[bool] = field(default_factory=Counter)  # start? -> new machines
    declined: dict[str, float] = field(default_factory=dict)  # machine -> until (monotonic)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    made: list[MachineView] = field(default_factory=list)  # machines made
    shortfall: str = ""
    lease: Lease | None = None  # the reconcile lease its actions run under
    no_room: core.NoRoom | None = None  # the last create that found no room (core)
    no_room_retry: asyncio.TimerHandle | None = None  # the pass asked for when it ends
    # new machines that did not come up (start failed, pull failed) or failed later
    # (destroyed): the next wait, as no room's; reset by one that came up
    failing: core.NoRoom | None = None
    workers: frozenset[str] = frozenset()  # the region's live workers at the last pass
    ends_seen: dict[str, float] = field(default_factory=dict)  # machine -> last event noted
    unsettled: bool = False  # the last pass found something to do (it looks again soon)


class AppActions:
    """Carries out the reconciler's actions (see the module's docstring)."""

    def __init__(self, store: AppStore, fleet: Fleet, placer: Placer, registry: Registry,
                 locks: AppLocks, work: dict[str, AppWork], *, spawn: Spawn,
                 holds: Callable[[AppWork], bool], clock: Callable[[], float],
                 drain_s: float) -> None:
        """`work`: the reconciler's, by app; `spawn(app, work, coro)`: run an action as
        the app's task (under its lease); `holds(work)`: the lease is still this
        placement's."""
        self.store, self.fleet, self.placer, self.registry = store, fleet, placer, registry
        self.locks, self.work = locks, work
        self._spawn, self.holds, self.clock, self.drain_s = spawn, holds, clock, drain_s
        self.counts: dict[str, dict[tuple[str, str], int]] = {}  # app -> (action, outcome)

    def _room_found(self, work: AppWork, found: bool) -> None:
        """A create found room (the next to find none waits from the first step) or not."""
        if work.no_room_retry is not None:
            work.no_room_retry.cancel()
            work.no_room_retry = None
        work.no_room = None if found else core.found_no_room(
            work.no_room, work.workers, asyncio.get_running_loop().time())

    def _came_up(self, work: AppWork, up: bool) -> None:
        """A new machine came up (new ones go ahead) or did not: a failed one destroyed, a
        pull or start that failed (new ones wait, doubling while they keep failing)."""
        work.failing = None if up else core.found_no_room(
            work.failing, work.workers, asyncio.get_running_loop().time())

    async def launch(self, config: AppConfig, views: list[MachineView],
                actions: list[core.Action], work: AppWork) -> None:
        creates: list[core.Create | core.Replace] = []
        for action in actions:
            if isinstance(action, core.Fence):
                await self.store.fence(config.uid, action.machine, self.clock())
                await self._event(config, "fence", action.reason, action.machine)
                self._spawn(config.name, work, self.publish_lost(config, action.machine))
            elif isinstance(action, core.Unfence):
                await self.store.unfence(action.machine)
                await self._event(config, "unfence", action.reason, action.machine)
                view = next((v for v in views if v.id == action.machine), None)
                if view is not None:
                    self._spawn(config.name, work, self.fleet.restore(config.name, view))
            elif isinstance(action, core.CompleteRelease):
                await self._complete_release(config, action)
            elif isinstance(action, core.FailRelease):
                self._spawn(config.name, work, self._fail_release(config, action.reason))
            elif isinstance(action, core.Start):
                work.busy[action.machine] = "start"
                self._spawn(config.name, work, self._start(config, views, action))
            elif isinstance(action, core.Destroy):
                work.busy[action.machine] = "destroy"
                if action.failed:  # its replacement waits, longer while machines keep failing
                    self._came_up(work, False)
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

    # -- actions -----------------------------------------------------------------------

    async def _start(self, config: AppConfig, views: list[MachineView],
                     action: core.Start) -> None:
        work = self.work[config.name]
        try:
            url = await self.fleet.worker_url(_worker_of(views, action.machine))
            answer = await self._start_call(config, url, action.machine)
            if isinstance(answer, Refused) and answer.declined():
                work.declined[action.machine] = asyncio.get_running_loop().time() \
                    + DECLINED_FOR_S
            await self._event(config, "start", action.reason, action.machine,
                              _outcome(answer))
        except PlacementError as exc:
            await self._event(config, "start", action.reason, action.machine, exc.message)
        finally:
            work.busy.pop(action.machine, None)

    async def _start_call(self, config: AppConfig, url: str, mid: str
                          ) -> MachineView | Refused | Unreachable:
        return await self.fleet.start(url, mid, config.health.timeout_s, slack_s=5.0)

    async def _destroy(self, config: AppConfig, views: list[MachineView],
                       action: core.Destroy) -> None:
        work = self.work[config.name]
        try:
            answer = await self.fleet.destroy(action.machine,
                                              worker=_worker_of(views, action.machine))
            # (an unreachable worker's machine is unfenced too, as before the Workers port;
            # whether it should stay fenced until its worker answers is issue 27's question)
            if not isinstance(answer, Refused) or answer.gone():
                await self.store.unfence(action.machine)
            await self._event(config, "destroy", action.reason, action.machine,
                              _outcome(answer))
        finally:
            work.busy.pop(action.machine, None)

    async def publish_lost(self, config: AppConfig, mid: str) -> None:
        """Edges stop routing to a lost machine: its registry record says `lost`, and
        outranks anything its agent may still publish, until the machine is destroyed
        (its record deleted) when the worker comes back."""
        await self.fleet.mark(config.name, mid, "lost", LOST_RECORD_AT)

    async def _retire(self, config: AppConfig, mid: str) -> None:
        """A replaced machine takes no new request (its record says so; edges follow it)
        and has `drain_s` to finish the ones it has before it is destroyed."""
        await self.fleet.mark(config.name, mid, "replaced", self.clock())
        await asyncio.sleep(self.drain_s)

    async def _create_all(self, config: AppConfig, views: list[MachineView],
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
                                                 spare=not action.start,
                                                 for_spares=not action.start)
            if not isinstance(placed, NewMachine):
                reason = placed.reason if isinstance(placed, NoCapacity) else work.shortfall
                work.shortfall = reason
                if isinstance(action, core.Create):
                    self._room_found(work, False)
                self._done_creating(work, action)
                await self._event(config, _verb(action), action.reason, _old(action),
                                  f"no capacity: {reason}")
                continue
            placed_on.add(placed.worker)
            # until it is up, it is no standby to start, trim or count twice as a spare
            work.busy[placed.view.id] = "create"
            self._room_found(work, True)
            note = (f"; shares worker {placed.worker}: no other worker fits"
                    if placed.worker in action.avoid else "")
            starts.append(self._bring_up(config, views, placed, action, note, rnd))
        await asyncio.gather(*starts)

    async def _bring_up(self, config: AppConfig, views: list[MachineView],
                        placed: NewMachine, action: core.Create | core.Replace, note: str,
                        rnd: Round | None) -> None:
        """Pull the image on the new machine's worker, start it if it is to run; a
        replacement that comes up takes its old machine's place (destroyed), one that
        does not fails the release."""
        work = self.work[config.name]
        mid = placed.view.id
        try:
            outcome, view = "ok", placed.view
            try:
                await self.fleet.pull(placed.url, rnd.image.ref if rnd else config.image)
            except PlacementError as exc:
                outcome = f"pull failed: {exc.message}"
            if outcome == "ok" and action.start:
                answer = await self._start_call(config, placed.url, mid)
                outcome = _outcome(answer)
                if isinstance(answer, MachineView):
                    view = answer
            if not await self.store.is_current(config):  # deleted (or made again) meanwhile
                await self.fleet.destroy(mid, url=placed.url)
                return
            work.made.append(view)
            if action.start or outcome != "ok":  # a spare pulled has not come up yet
                self._came_up(work, outcome == "ok")
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
            work.busy.pop(mid, None)
            self._done_creating(work, action)

    def _done_creating(self, work: AppWork, action: core.Create | core.Replace) -> None:
        if isinstance(action, core.Replace):
            work.busy.pop(action.machine, None)
        else:
            work.creating[action.start] -= 1

    async def note_ends(self, config: AppConfig, work: AppWork,
                        views: list[MachineView]) -> None:
        """Crashes and failures of the app's machines (how each ended: `oom`, `exited(3)`,
        a crash loop's last output) become app events, each once (placement/core/ends)."""
        events = {v.id: [(e.at, e.event, e.reason) for e in v.events] for v in views}
        ends, work.ends_seen = new_ends(events, work.ends_seen)
        for end in ends:
            await self._event(config, end.event, end.reason, machine=end.machine,
                              outcome=end.reason.split(";")[0] or end.event)

    async def _complete_release(self, config: AppConfig, action: core.CompleteRelease) -> None:
        """The release's rollout is done; a rollback's marks the release it replaced
        rolled_back (not before: were the rollback to fail, the app goes back to it)."""
        await self.store.set_release_status(config.uid, action.release, "complete",
                                            action.reason)
        await self._event(config, "release", action.reason)
        done = await self.store.release(config.uid, action.release)
        if done is not None and done.rollback_to and done.replaces:
            await self.store.set_release_status(config.uid, done.replaces, "rolled_back",
                                                f"rolled back to {done.rollback_to}")

    async def _fail_release(self, config: AppConfig, reason: str) -> None:
        """The release being rolled out failed: the app goes back to the release that ran
        when it was made (its machine fields; no new release) — or, for a record that does
        not say, the last complete one before it — and keeps serving on it."""
        async with self.locks.hold(config.name):
            current = await self.store.get(config.name)
            if current.uid != config.uid or current.release != config.release:
                return  # changed meanwhile (a new deploy, a rollback): nothing to undo
            back = going_back_to(await self.store.releases(current.uid), current.release)
            restored = None
            if back is not None:
                fields = {name: getattr(back.config, name) for name in ROLLBACK_FIELDS}
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
        counts = self.counts.setdefault(config.name, {})
        key = (action, outcome_class(outcome))
        counts[key] = counts.get(key, 0) + 1
        await self.store.add_event(config.uid, AppEvent(self.clock(), action, reason, machine,
                                                        outcome))


def _worker_of(views: list[MachineView], mid: str) -> str:
    return next((v.worker for v in views if v.id == mid), "")


def _verb(action: core.Create | core.Replace) -> str:
    return "replace" if isinstance(action, core.Replace) else "create"


def _old(action: core.Create | core.Replace) -> str:
    return action.machine if isinstance(action, core.Replace) else ""


def _outcome(answer: MachineView | Refused | Unreachable) -> str:
    if isinstance(answer, MachineView):
        return "ok"
    if isinstance(answer, Refused):
        return f"{answer.status}: {answer.message}"
    return f"unreachable: {answer.message}"
