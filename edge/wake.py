"""Wakes (single flight per app) and auto-stop, carried out against placement.

The decisions come from edge/core (`scaling.next_wake`, `autostop.machines_to_stop`);
this module awaits placement and applies the answers to the view.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from edge.adapters.placement import PlacementClient
from edge.core.autostop import MachineActivity, machines_to_stop
from edge.errors import EdgeError
from edge.view import STARTED, AppEntry, MachineSlot
from placement.api import AutostopRequest, SuspectReport, WakeRequest, WakeTimings

if TYPE_CHECKING:
    from edge.exchange import Exchange
    from edge.service import Edge

log = logging.getLogger("thaw.edge.wake")

WAKE_BACKOFF_S = 1.0
SUSPECT_EVERY_S = 1.0  # reports of one worker to placement, at most one per this
MAX_SUSPECTED = 10_000


class Waker:
    def __init__(self, edge: Edge) -> None:
        self.edge = edge
        self.placement = PlacementClient(edge.config)
        self.backoff_until: dict[str, float] = {}
        self._suspected: dict[str, float] = {}  # worker -> loop time of the last report
        self._timings: dict[str, tuple[float, WakeTimings]] = {}
        self._autostop_task: asyncio.Task[None] | None = None

    def last_timings(self, app: AppEntry, exchange: Exchange) -> WakeTimings | None:
        """Timings of the wake that ended while `exchange` was held, if any."""
        found = self._timings.get(app.name)
        if found is None or found[0] < exchange.held_at:
            return None
        return found[1]

    async def wake(self, app: AppEntry, count: int) -> None:
        edge = self.edge
        loop = edge.loop
        budget_s = app.config.hold_timeout_s
        region = edge.config.region if edge.config.region in app.config.regions else ""
        # at least 1 ms: placement refuses less, and the app would never start
        deadline_ms = max(1, int(budget_s * 1000))
        request = WakeRequest(count=count, deadline_ms=deadline_ms, region=region)
        # Judge "did this wake add anything" against what was routable when it was sent:
        # the registry feed may report the woken machines before the answer arrives.
        routable_before = {slot.id for slot in app.routable}
        started = loop.time()
        try:
            answer = await self.placement.wake(app.name, request,
                                               budget_s + edge.config.wake_grace_s)
        except EdgeError as exc:
            self._wake_failed(app, exc, loop.time() - started)
            return
        finally:
            app.wake_in_flight = False
            app.starting = 0
        edge.metrics.wake_seconds.labels(app.name).observe(loop.time() - started)
        edge.metrics.wakes.labels(app.name, "ok").inc()
        for phase, ms in (("place", answer.timings.place_ms), ("pull", answer.timings.pull_ms),
                          ("boot", answer.timings.boot_ms)):
            edge.metrics.wake_phase_seconds.labels(phase).observe(ms / 1000.0)
        self._timings[app.name] = (loop.time(), answer.timings)
        current = edge.view.apps.get(app.name, app)
        # machines this edge saw refuse connects: placement may not know yet; trying them
        # again is fine, asking again at once for the same would loop
        seen_dead = {m.id for m in answer.machines if (app.name, m.id) in edge.view.tombstones}
        for machine in answer.machines:
            edge.view.add_started(app.name, machine.id, machine.address, machine.worker)
        if not {m.id for m in answer.machines} - routable_before - seen_dead:
            # Placement had nothing new to start (capped, or its count differs from ours):
            # do not ask again at once, or held requests would drive a tight wake loop.
            self.backoff_until[app.name] = loop.time() + WAKE_BACKOFF_S
        edge.release_held(current, answer.timings)
        edge.maybe_wake(current)

    def _wake_failed(self, app: AppEntry, exc: EdgeError, took_s: float) -> None:
        edge = self.edge
        edge.metrics.wake_seconds.labels(app.name).observe(took_s)
        edge.metrics.wakes.labels(app.name, exc.code).inc()
        log.warning("wake of %s failed: %s %s", app.name, exc.code, exc.message)
        self.backoff_until[app.name] = edge.loop.time() + WAKE_BACKOFF_S
        # "deadline" means machines are still booting (placement keeps them going): held
        # requests wait out their own deadlines, and the next wake waits for those machines
        # instead of starting more. Any other failure is final for the held requests.
        if not app.routable and exc.code != "deadline":
            edge.fail_held_by_name(app.name, exc.code, f"wake failed: {exc.message}")

    # -- suspect workers ------------------------------------------------------------------

    def suspect(self, slot: MachineSlot, error: BaseException) -> None:
        """A connect to `slot` failed: tell placement (at most once per worker per
        SUSPECT_EVERY_S); if placement counts the worker failed, route to none of its
        machines."""
        now = self.edge.loop.time()
        if not slot.worker or now - self._suspected.get(slot.worker, -SUSPECT_EVERY_S) \
                < SUSPECT_EVERY_S:
            return
        if len(self._suspected) >= MAX_SUSPECTED:
            self._suspected.clear()
        self._suspected[slot.worker] = now
        report = SuspectReport(reporter=self.edge.instance_id, machine=slot.id[:64],
                               address=slot.address[:300], error=repr(error)[:300])
        self.edge.spawn(self._report(slot.worker, report))

    async def _report(self, worker: str, report: SuspectReport) -> None:
        try:
            answer = await self.placement.suspect(worker, report)
        except EdgeError as exc:
            log.warning("could not report worker %s as suspect: %s", worker, exc.message)
            return
        if answer.failed:
            dropped = self.edge.view.worker_failed(worker)
            log.warning("worker %s is failed (%s): %d machines no longer routed to", worker,
                        answer.reason, dropped)

    # -- auto-stop -----------------------------------------------------------------------

    def start_autostop(self) -> None:
        self._autostop_task = asyncio.create_task(self._autostop_loop())

    async def stop(self) -> None:
        if self._autostop_task is not None:
            self._autostop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._autostop_task
        await self.placement.close()

    async def _autostop_loop(self) -> None:
        while True:
            await asyncio.sleep(self.edge.config.autostop_interval_s)
            try:
                self.autostop_pass()
            except Exception:
                log.exception("auto-stop pass failed")

    def autostop_pass(self) -> None:
        now = self.edge.loop.time()
        for app in list(self.edge.view.apps.values()):
            config = app.config
            activity = [
                MachineActivity(m.id, m.in_flight, m.last_start, m.draining)
                for m in app.machines.values() if m.state == STARTED
            ]
            for machine_id in machines_to_stop(activity, config.auto_stop, config.idle_timeout_s,
                                               config.min_machines_running, now):
                slot = app.machines[machine_id]
                self.edge.view.set_draining(slot, True)
                self.edge.spawn(self._autostop(app, slot, now - slot.last_start))

    async def _autostop(self, app: AppEntry, slot: MachineSlot, idle_s: float) -> None:
        edge = self.edge
        try:
            stopped = await self.placement.autostop(app.name, slot.id, AutostopRequest(idle_s))
        except EdgeError as exc:
            log.warning("autostop of %s/%s failed: %s", app.name, slot.id, exc.message)
            stopped, result = False, "error"
        else:
            result = "stopped" if stopped else "kept"
        edge.metrics.autostops.labels(app.name, result).inc()
        if stopped:
            edge.view.mark(slot, "stopped")
            return
        slot.last_start = edge.loop.time()  # kept: give it another idle period
        edge.view.set_draining(slot, False)
        current = edge.view.apps.get(app.name)
        if current is not None:
            edge.release_held(current)
