"""The edge's calls to placement that are not wakes: auto-stop of idle machines, and
reports of workers whose machines refused connects.

The decisions are pure (`autostop.machines_to_stop`; at most one report per
worker per `SUSPECT_EVERY_S`); this module awaits placement and applies the
answers to the view. It knows the shell only as two callables.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from edge.adapters.placement import PlacementClient
from edge.core.autostop import MachineActivity, machines_to_stop
from edge.errors import EdgeError
from edge.view import STARTED, AppEntry, MachineSlot, View
from ground.logs import event
from ground.periodic import Periodic
from placement.api import AutostopRequest, SuspectReport

log = logging.getLogger("thaw.edge.wake")

SUSPECT_EVERY_S = 1.0  # reports of one worker to placement, at most one per this
MAX_SUSPECTED = 10_000

Spawn = Callable[[Coroutine[Any, Any, None]], None]
# a quiet edge's auto-stop pass comes when the first machine's idle time runs out, but
# at least this often (a bound on what a missed wake() could delay)
QUIET_PASS_MAX_S = 30.0


async def _always() -> bool:
    return True


class Suspects:
    """Tells placement of workers whose machines refused connects."""

    def __init__(self, view: View, placement: PlacementClient, spawn: Spawn,
                 loop: asyncio.AbstractEventLoop, reporter: str) -> None:
        self.view = view
        self.placement = placement
        self.spawn = spawn
        self.loop = loop
        self.reporter = reporter
        self._suspected: dict[str, float] = {}  # worker -> loop time of the last report

    def report(self, slot: MachineSlot, error: BaseException) -> None:
        """A connect to `slot` failed: tell placement (at most once per worker per
        SUSPECT_EVERY_S); if placement counts the worker failed, route to none of its
        machines."""
        now = self.loop.time()
        if not slot.worker or now - self._suspected.get(slot.worker, -SUSPECT_EVERY_S) \
                < SUSPECT_EVERY_S:
            return
        if len(self._suspected) >= MAX_SUSPECTED:
            self._suspected.clear()
        self._suspected[slot.worker] = now
        report = SuspectReport(reporter=self.reporter, machine=slot.id[:64],
                               address=slot.address[:300], error=repr(error)[:300])
        self.spawn(self._report(slot.worker, report))

    async def _report(self, worker: str, report: SuspectReport) -> None:
        try:
            answer = await self.placement.suspect(worker, report)
        except EdgeError as exc:
            log.warning("could not report worker %s as suspect: %s", worker, exc.message)
            return
        if answer.failed:
            dropped = self.view.worker_failed(worker)
            log.warning("worker %s is failed (%s): %d machines no longer routed to", worker,
                        answer.reason, dropped)


class Autostop:
    """Asks placement to stop (or suspend) idle machines: a pass every
    `autostop_interval_s` while the edge has requests of its own or the others' load on
    its machines; while it is quiet (`quiet()`: none of either), only time and the view
    can make a machine idle, so the next pass comes when the first machine's idle time
    runs out (at most `QUIET_PASS_MAX_S` later), or at once when `wake()` says something
    changed (a machine or an app's settings in the view, the first client connection)."""

    def __init__(self, view: View, placement: PlacementClient, spawn: Spawn,
                 loop: asyncio.AbstractEventLoop, interval_s: float,
                 on_kept: Callable[[AppEntry], None],
                 fresh: Callable[[], Awaitable[bool]] = _always,
                 quiet: Callable[[], bool] = lambda: False) -> None:
        self.view = view
        self.placement = placement
        self.spawn = spawn
        self.loop = loop
        self.interval_s = interval_s
        self.on_kept = on_kept  # a machine placement kept can take held requests again
        # the other edges' loads on the machines, read as of now if they are older (an
        # idle edge reads them once a second: edge/loadshare.py); False: not known now
        # (the board away), no stop this pass
        self.fresh = fresh
        self.quiet = quiet
        self._passes = Periodic("auto-stop passes failing", self.run_pass, interval_s, log)

    def start(self) -> None:
        self._passes.start()

    async def stop(self) -> None:
        await self._passes.close()

    def wake(self) -> None:
        """Something a quiet edge's next pass was timed without changed: pass soon."""
        self._passes.stir()

    async def run_pass(self) -> float | None:
        """Stop what is idle; the seconds until the next pass, a stir sooner, when the
        edge is quiet (None: the usual interval)."""
        idle, next_at = self.look(self.loop.time())
        if idle:
            if not await self.fresh():  # another edge may keep one busy: look again later
                return None
            idle, next_at = self.look(self.loop.time())  # as of after the read
        for app, slot in idle:
            self.view.set_draining(slot, True)
            self.spawn(self._stop(app, slot, self.loop.time() - slot.last_start))
        if not self.quiet():
            return None
        return min(max(next_at - self.loop.time(), self.interval_s), QUIET_PASS_MAX_S)

    def look(self, now: float) -> tuple[list[tuple[AppEntry, MachineSlot]], float]:
        """The machines idle long enough to stop now, and when the first machine not yet
        idle long enough will be (if nothing changes meanwhile; infinity: none)."""
        idle: list[tuple[AppEntry, MachineSlot]] = []
        next_at = math.inf
        for app in list(self.view.apps.values()):
            config = app.config
            if config.auto_stop == "off":
                continue
            due = False  # a machine idle long enough: the app's machines are weighed
            for m in app.machines.values():
                if m.in_flight == 0:
                    at = m.last_start + config.idle_timeout_s
                    if at <= now:
                        due = True
                    elif at < next_at:
                        next_at = at
            if not due:
                continue
            activity = [
                MachineActivity(m.id, m.in_flight, m.last_start, m.draining)
                for m in app.machines.values() if m.state == STARTED
            ]
            idle += [(app, app.machines[machine_id]) for machine_id in machines_to_stop(
                activity, config.auto_stop, config.idle_timeout_s, config.min_machines_running,
                now)]
        return idle, next_at

    async def _stop(self, app: AppEntry, slot: MachineSlot, idle_s: float) -> None:
        try:
            stopped = await self.placement.autostop(app.name, slot.id, AutostopRequest(idle_s))
        except EdgeError as exc:
            event(log, "autostop", logging.WARNING, app=app.name, machine=slot.id,
                  worker=slot.worker, idle_s=round(idle_s, 1), result="error",
                  message=exc.message)
            stopped, result = False, "error"
        else:
            result = "stopped" if stopped else "kept"
            event(log, "autostop", app=app.name, machine=slot.id, worker=slot.worker,
                  idle_s=round(idle_s, 1), result=result)
        app.stats.autostopped(result)
        if stopped:
            self.view.mark(slot, "stopped")
            return
        slot.last_start = self.loop.time()  # kept: give it another idle period
        self.view.set_draining(slot, False)
        current = self.view.apps.get(app.name)
        if current is not None:
            self.on_kept(current)
