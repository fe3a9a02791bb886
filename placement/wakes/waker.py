"""Wake: start machines of an app within the edge's budget.

A wake asks the core for a plan (reuse stopped machines, then place new ones),
starts every machine concurrently through its agent, and answers as soon as all
are ready — or, at the latest, `wake_margin_ms` before the deadline with the ones
ready so far. Machines that are not ready by then keep starting; the edge sees
them through the registry. A worker that declines a start (no room now) gets a
new machine placed elsewhere instead, within `max_machines`.

Before any machine is ready, once every machine's worker is decided, the wake
predicts when its first will be (placement/core/predict.py) and hands that to the
caller's sink (`predictions_to`): the HTTP route streams it to the edge, which
refuses at once the held requests that cannot wait that long. The prediction
changes nothing here: every machine is started, and the answer and its timeouts
are as without it. Each answer carries the prediction and the time the first
machine was actually ready, and both are logged, to measure the prediction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import msgspec

from agent.api import MachineView
from ground.appconfig import AppConfig
from ground.logs import event
from ground.registry import MachineRecord, WorkerStatus
from ground.tasks import both
from placement.api import (
    WAKE_ERRORS,
    WakeRequest,
    WakeResponse,
    WakeTimings,
)
from placement.core.claims import Claims
from placement.core.predict import BootHistory, StartsInFlight, WakeForecast
from placement.core.wake import (
    Machine,
    MachineState,
    WakePlan,
    plan_wake,
    states_of,
    wake_failure,
)
from placement.errors import PlacementError
from placement.fleet.fleet import Fleet
from placement.placer import NewMachine, Placer, Round
from placement.ports.workers import Refused, Unreachable
from placement.store import StoreUnavailable
from placement.wakes.wakeclaims import DEMAND_AFTER_S, WakeClaims
from placement.wakes.wakeparts import (
    IMAGE_REFUSALS,
    Failed,
    NewMachines,
    Outcome,
    Ready,
    Slot,
    boot_ms,
    goes_elsewhere,
    is_declined,
    is_lost,
    is_ready,
    ms_since,
    outcome_of,
    prediction_sink,
    reuse_kind,
    store_retried,
    total_ms,
    woken,
)

log = logging.getLogger("thaw.placement")


class Waker:
    def __init__(
        self, fleet: Fleet, placer: Placer, margin_ms: int,
        is_current: Callable[[AppConfig], Awaitable[bool]], claims: WakeClaims | None = None,
    ) -> None:
        """`is_current(config)`: the app still exists as that incarnation (the store);
        `claims`: what this and other placements' wakes are starting
        (placement/wakes/wakeclaims.py)."""
        self.fleet = fleet
        self.is_current = is_current
        self.boots = BootHistory()  # each app's boot spans, for predictions
        self.in_flight = StartsInFlight()  # the starts of this placement's wakes, per worker
        self.placer = placer
        self.margin_s = margin_ms / 1000
        self.claims = claims or WakeClaims()
        self.background: set[asyncio.Task[Outcome]] = set()
        # Waits (until a loop time) for the registry's view to be whole again after a
        # loss; whether it is (placement/fleet/republish.py). None: it is always taken as is.
        self.view_whole: Callable[[float], Awaitable[bool]] | None = None
        self.running: Counter[str] = Counter()  # the wakes of each app under way here
        # Told an app's name whenever a wake of it here ends (the reconciler's passes
        # over it wait for that: placement/reconciling/passes.py)
        self.woken: Callable[[str], None] = lambda _app: None

    def waking(self, app: str) -> bool:
        """Whether a wake of `app` runs here now."""
        return app in self.running

    async def close(self) -> None:
        for task in list(self.background):
            task.cancel()
        for task in list(self.background):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.claims.close()

    async def wake(self, config: AppConfig, request: WakeRequest) -> WakeResponse:
        self.running[config.name] += 1
        try:
            return await self._wake(config, request)
        finally:
            self.running[config.name] -= 1
            if not self.running[config.name]:
                del self.running[config.name]
            # each wake's end, not only the last's: wakes of a busy app that overlap
            # would otherwise hold its passes back for as long as they keep coming
            self.woken(config.name)

    async def _wake(self, config: AppConfig, request: WakeRequest) -> WakeResponse:
        loop = asyncio.get_running_loop()
        received = loop.time()
        answer_by = received + request.deadline_ms / 1000 - self.margin_s
        region = request.region or config.regions[0]
        await self._view_whole(config.name, answer_by)
        # Planned under the app's wake lease, with every placement's claims: two wakes of
        # one app (from two edges, maybe through two placements) start what both asked for.
        # Sized from every edge's demand when the edge tells its own (see wakeclaims).
        async with self.claims.planning(config.name, answer_by) as claims:
            demand, (everywhere, views) = await both(
                self._demand(config.name, request, answer_by - loop.time()),
                self._observe(config, answer_by))
            here = {wid for wid, w in everywhere.items() if w.region == region}
            plan = plan_wake(config, states_of(views, config), everywhere.keys(),
                             request.count, claims.starting, claims.placing,
                             region_workers=here, demand=demand)
            event(log, "wake_planned", logging.DEBUG, app=config.name, demand=demand,
                  count=request.count, reuse=len(plan.reuse), new=plan.new,
                  others_placing=claims.placing, others_starting=len(claims.starting),
                  machines=" ".join(f"{state}:{n}" for state, n in
                                    sorted(Counter(v.state for v in views).items())))
            self.claims.planned(config.name, [m.id for m in plan.reuse], plan.new)
        new = NewMachines(self.placer, config, region, views, everywhere.keys(), answer_by)
        new.claimed.update(m.id for m in plan.reuse)
        try:
            if not plan.reuse and not plan.new:
                return self._nothing_to_start(config, views, plan.shortfall, claims)
            return await self._start(config, plan, new, everywhere, answer_by, received)
        finally:
            # Answered: what is still starting is no longer this wake's to wait for; a later
            # wake finds it starting, unclaimed, and waits for it instead of starting more.
            for machine in new.claimed:
                self.claims.unclaim(config.name, machine)
            if request.demand is not None and request.edge is not None:
                self.claims.report_after(config.name, request.edge, request.demand)

    async def _view_whole(self, app: str, answer_by: float) -> None:
        """Hold the wake while the registry is being filled again after a loss: the view
        lacks the workers and machines not back yet, so a plan now would find no room
        (`no_capacity`) or start a second machine beside a stopped one not seen."""
        if self.view_whole is not None and not await self.view_whole(answer_by):
            raise PlacementError(f"app {app}: the registry is being filled again after a "
                                 "loss, and not every worker was back before the deadline",
                                 code="deadline", status=WAKE_ERRORS["deadline"])

    async def _demand(self, app: str, request: WakeRequest, ttl_s: float) -> int | None:
        """Every edge's demand for `app`, this request's edge's included (None: the request
        says none: size it by its count)."""
        if request.demand is None or request.edge is None:
            return None
        return await self.claims.report(app, request.edge, request.demand,
                                        max(0.0, ttl_s) + DEMAND_AFTER_S)

    async def _start(self, config: AppConfig, plan: WakePlan, new: NewMachines,
                     everywhere: dict[str, WorkerStatus], answer_by: float,
                     received: float) -> WakeResponse:
        """Start what `plan` says, answer as soon as all are ready or at `answer_by`."""
        forecast = WakeForecast(config.name, len(plan.reuse) + plan.new, everywhere,
                                self.boots, self.placer.params.reference_bandwidth_bytes_per_s,
                                received)
        slots = [Slot(forecast, index, prediction_sink(), self.in_flight)
                 for index in range(len(plan.reuse) + plan.new)]
        for slot, machine in zip(slots, plan.reuse, strict=False):  # workers known now
            slot.decided(reuse_kind(machine.state), machine.worker)
        work: list[Coroutine[Any, Any, Outcome]] = [
            self._restart(config.name, m, answer_by, new, slot, everywhere.get(m.worker))
            for m, slot in zip(plan.reuse, slots, strict=False)
        ]
        work += [self._start_new(config.name, new, answer_by, slot)
                 for slot in slots[len(plan.reuse):]]
        answer = await self._gather(work, slots, answer_by, plan.shortfall, forecast)
        predicted_ms, ready_ms = forecast.measured()
        event(log, "wake_predicted", app=config.name, predicted_ms=predicted_ms,
              ready_ms=ready_ms, machines=len(answer.machines))
        return msgspec.structs.replace(answer, predicted_ms=predicted_ms, ready_ms=ready_ms)

    async def _observe(self, config: AppConfig,
                       answer_by: float) -> tuple[dict[str, WorkerStatus], list[MachineRecord]]:
        """Live workers and the app's machines, from the registry's view (no round trip to
        the agents on the cold path): starts are checked transitions at the agent, and
        start?wait_s accepts a machine someone else started, so a stale view costs a
        failed start at most."""
        try:
            async with asyncio.timeout_at(answer_by):
                return await both(self.fleet.live_workers(),
                                  self.fleet.registered_machines(config))
        except TimeoutError:
            raise PlacementError("no answer from the workers before the deadline",
                                 code="deadline", status=WAKE_ERRORS["deadline"]) from None

    async def _gather(
        self, work: list[Coroutine[Any, Any, Outcome]], slots: list[Slot], answer_by: float,
        shortfall: str, forecast: WakeForecast,
    ) -> WakeResponse:
        """Run `work` (one start per slot of `slots`, in order) until all are done or
        `answer_by`; a start that ends (even cancelled) is no longer in flight."""
        loop = asyncio.get_running_loop()
        tasks = [asyncio.create_task(w) for w in work]
        for task, slot in zip(tasks, slots, strict=True):
            # tracked from the start: close() cancels them, whatever happens
            self.background.add(task)
            task.add_done_callback(self.background.discard)
            task.add_done_callback(lambda _, slot=slot: slot.ended())
            task.add_done_callback(lambda t: forecast.ready(loop.time()) if is_ready(t) else None)
        timeout = max(0.0, answer_by - asyncio.get_running_loop().time())
        done, pending = await asyncio.wait(tasks, timeout=timeout)
        outcomes = [outcome_of(t) for t in tasks if t in done]
        ready = [o for o in outcomes if isinstance(o, Ready)]
        failed = [o for o in outcomes if isinstance(o, Failed)]
        if not ready:
            code = wake_failure([f.code for f in failed],
                                len(pending) + sum(f.code == "deadline" for f in failed))
            reasons = "; ".join(f.message for f in failed) or "no machine ready in time"
            raise PlacementError(reasons, code=code, status=WAKE_ERRORS[code])
        notes = [shortfall] if shortfall else []
        notes += [f"{f.code}: {f.message}" for f in failed]
        if pending:
            notes.append(f"{len(pending)} still starting at the deadline")
        return WakeResponse(
            machines=[woken(r.view) for r in ready],
            timings=max((r.timings for r in ready), key=total_ms),
            shortfall="; ".join(notes),
        )

    def _nothing_to_start(self, config: AppConfig, views: Sequence[Machine], shortfall: str,
                          claims: Claims) -> WakeResponse:
        """The machines started, or, when other wakes are starting what the demand needs
        (`claims`, as the plan saw them), none: the edge sees theirs come up. Else
        no_capacity."""
        started = [v for v in views if v.state == "started" and v.address]
        if started:
            return WakeResponse(machines=[woken(v) for v in started], shortfall=shortfall)
        coming_up = claims.placing + len(claims.starting | {
            v.id for v in views if v.state == "starting"})
        if coming_up:
            return WakeResponse(machines=[], shortfall=shortfall or (
                f"{coming_up} machines other wakes are starting are enough for the demand"))
        raise PlacementError(shortfall or f"app {config.name}: nothing to start",
                             code="no_capacity", status=WAKE_ERRORS["no_capacity"])

    async def _restart(self, app: str, machine: MachineState, answer_by: float,
                       new: NewMachines, slot: Slot, worker: WorkerStatus | None) -> Outcome:
        """Start a stopped/suspended machine again (its image is already on the worker).
        A worker without room for it now declines: a new machine is placed elsewhere
        instead, if `max_machines` allows it while the declined one, left as it is (for
        the reconciler to replace), still counts. `worker`: the machine's, as this wake
        read it (its address without reading the workers again: two round trips of a
        resume's ~10 ms), None if it was not among the live ones."""
        began = time.perf_counter()
        try:
            url = worker.url if worker is not None else await self.fleet.worker_url(
                machine.worker)
            outcome = await self._start_and_wait(url, machine.id, answer_by, began, 0.0)
        except PlacementError as exc:
            outcome = Failed("start_failed", f"{machine.id}: {exc.message}")
        finally:
            self.claims.unclaim(app, machine.id)
        if isinstance(outcome, Ready):
            self.boots.observe(app, machine.state == "suspended", outcome.timings.boot_ms,
                               slot.stretch)
        if not goes_elsewhere(outcome):
            return outcome
        refused = self._count_another(app, new, answer_by, outcome.message)
        if refused is not None:
            return refused
        log.info("%s: worker %s %s; placing another machine", machine.id, machine.worker,
                 "has no room to start it now" if is_declined(outcome) else "is not answering")
        return await self._start_new(app, new, answer_by, slot)

    async def _start_new(self, app: str, new: NewMachines, answer_by: float,
                         slot: Slot) -> Outcome:
        """Place a machine and start it (counted in `placing` by the caller until placed).
        A worker that declines the start (its room taken since its last heartbeat) has
        that machine destroyed, and one more is placed on another worker: once; so is one
        whose worker stops answering mid-wake (its host died: the machine stays there, for
        the reconciler once it is back). `slot`: the machine's in its wake (a replacement
        keeps the slot of the one it replaces)."""
        began = time.perf_counter()
        outcome = await self._place_and_start(app, new, answer_by, began, slot)
        if not goes_elsewhere(outcome):
            return outcome
        refused = self._count_another(app, new, answer_by, outcome.message)
        if refused is not None:
            return refused
        again = await self._place_and_start(app, new, answer_by, began, slot)
        if is_declined(again) and is_declined(outcome):
            return Failed("no_capacity",
                          f"two workers declined to start a new machine: {again.message}")
        if goes_elsewhere(again):
            return Failed("start_failed", f"a second worker failed too: {again.message} "
                                          f"(first: {outcome.message})")
        return again

    def _count_another(
        self, app: str, new: NewMachines, answer_by: float, declined: str
    ) -> Failed | None:
        """Count one more new machine as `placing`, or say why none may be placed:
        no time left, or no room under `max_machines`. `declined`: the start declined."""
        if asyncio.get_running_loop().time() >= answer_by:
            return Failed("deadline", f"{declined}; no time left to place another machine")
        if new.room(self.claims.placing(app)) == 0:
            return Failed("no_capacity", (
                f"{declined}; max_machines={new.config.max_machines} leaves no room for "
                f"another machine while the app's existing ones count"))
        self.claims.place_another(app)
        return None

    async def _place_and_start(
        self, app: str, new: NewMachines, answer_by: float, began: float, slot: Slot,
    ) -> Outcome:
        """One machine placed, pulled and started; one whose start its worker declines is
        destroyed (the outcome stays "declined"). `slot` is told its worker once known
        (or that it failed before), and its boot is learnt under the slot's contention."""
        placed: NewMachine | Failed = Failed("start_failed", "not placed")
        try:
            rnd = await new.round()
            if isinstance(rnd, Failed):
                return rnd
            placed = await new.place(rnd)
            if not isinstance(placed, Failed):
                slot.decided("new", placed.worker, rnd.image.layers)
        finally:
            if isinstance(placed, Failed):
                slot.failed()
            # From here on the machine exists on an agent (or never will): no longer
            # "placing" but claimed, until its start ends (the registry may not show it
            # yet, or show it created while its image is pulled: no other wake takes it).
            made = None if isinstance(placed, Failed) else placed.view.id
            self.claims.placed(app, made)
            if made is not None:
                new.claimed.add(made)
        if isinstance(placed, Failed):
            return placed
        try:
            outcome = await self._start_placed(app, new, rnd, placed, answer_by, began)
        finally:
            self.claims.unclaim(app, placed.view.id)
        if isinstance(outcome, Ready):
            self.boots.observe(app, False, outcome.timings.boot_ms, slot.stretch)
        return outcome

    async def _start_placed(self, app: str, new: NewMachines, rnd: Round, placed: NewMachine,
                            answer_by: float, began: float) -> Outcome:
        """Pull and start a machine this wake placed; destroyed if its worker declines."""
        try:
            current = await store_retried(lambda: self.is_current(new.config), answer_by,
                                          self.placer.metrics.waited)
        except (TimeoutError, StoreUnavailable):
            await self._release(placed.url, placed.view.id)
            return Failed("deadline", f"app {app}: the store did not answer before the "
                                      "deadline (is it still there?)")
        if not current:  # deleted (or re-made) while this was placed
            await self._release(placed.url, placed.view.id)
            return Failed("no_capacity", f"app {app} was deleted while a machine was placed")
        outcome = await self._pull_and_start(placed, rnd.image.ref, answer_by, began)
        if is_declined(outcome):
            log.info("%s: worker %s declined to start it; destroying it",
                     placed.view.id, placed.worker)
            destroyed = await self._release(placed.url, placed.view.id)
            new.declined(rnd, placed.worker, destroyed=destroyed)
        elif is_lost(outcome):  # no destroy to ask of a worker that does not answer
            log.warning("%s: worker %s stopped answering mid-wake: %s", placed.view.id,
                        placed.worker, outcome.message)
            new.declined(rnd, placed.worker, destroyed=False)
        return outcome

    async def _pull_and_start(
        self, placed: NewMachine, image_ref: str, answer_by: float, began: float
    ) -> Outcome:
        place_ms = ms_since(began)
        pull_began = time.perf_counter()
        try:
            await self.fleet.pull(placed.url, image_ref)
        except PlacementError as exc:
            code = ("image_unavailable" if exc.code in IMAGE_REFUSALS else
                    "worker_lost" if exc.code == "worker_unreachable" else "start_failed")
            return Failed(code, f"pull on {placed.worker}: {exc.message}")
        pull_ms = ms_since(pull_began)
        try:
            outcome = await self._start_and_wait(
                placed.url, placed.view.id, answer_by, began, pull_ms
            )
        except PlacementError as exc:
            return Failed("start_failed", f"{placed.view.id}: {exc.message}")
        if isinstance(outcome, Ready):
            timings = outcome.timings
            return Ready(outcome.view, WakeTimings(place_ms, timings.pull_ms, timings.boot_ms))
        return outcome

    async def _start_and_wait(
        self, url: str, mid: str, answer_by: float, began: float, pull_ms: float
    ) -> Outcome:
        remaining = answer_by - asyncio.get_running_loop().time()
        if remaining <= 0:
            return Failed("deadline", f"{mid}: no time left to start it")
        answer = await self.fleet.start(url, mid, remaining)
        if isinstance(answer, Unreachable):
            return Failed("worker_lost", f"{mid}: its worker did not answer the start")
        if isinstance(answer, MachineView):
            boot = boot_ms(answer)
            place_ms = max(0.0, ms_since(began) - pull_ms - boot)
            return Ready(answer, WakeTimings(place_ms, pull_ms, boot))
        if answer.status == 408:
            return Failed("deadline", f"{mid} still starting")
        if answer.declined():
            return Failed("declined", f"{mid}: {answer.message}")  # no room there now
        return Failed("start_failed", f"{mid}: {answer.message}")

    async def _release(self, url: str, machine_id: str) -> bool:
        """Destroy a machine this placement made; False if it may still be there."""
        answer = await self.fleet.destroy(machine_id, url=url)
        if isinstance(answer, MachineView) or (isinstance(answer, Refused) and answer.gone()):
            return True
        log.warning("machine %s could not be destroyed now: %s", machine_id, answer.message)
        return False
