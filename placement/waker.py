"""Wake (start machines of an app within the edge's budget) and autostop.

A wake asks the core for a plan (reuse stopped machines, then place new ones),
starts every machine concurrently through its agent, and answers as soon as all
are ready — or, at the latest, `wake_margin_ms` before the deadline with the ones
ready so far. Machines that are not ready by then keep starting; the edge sees
them through the registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from placement.adapters.agents import AgentClient, AgentUnreachable
from placement.api import WAKE_ERRORS, WakeRequest, WakeResponse, WakeTimings, WokenMachine
from placement.core.offers import NoCapacity
from placement.core.wake import MachineState, Refuse, decide_autostop, plan_wake, wake_failure
from placement.errors import AgentReplied, Conflict, PlacementError
from placement.fleet import Fleet
from placement.placer import Placer, Round
from thaw.appconfig import AppConfig

log = logging.getLogger("thaw.placement")


@dataclass(frozen=True)
class Ready:
    view: dict[str, Any]
    timings: WakeTimings


@dataclass(frozen=True)
class Failed:
    code: str  # no_capacity | start_failed | image_unavailable | deadline
    message: str


# An agent's answer to a pull that no retry will change (imagecache error codes).
IMAGE_REFUSALS = frozenset({"bad_reference", "forbidden_host", "not_found", "unauthorized",
                            "digest_mismatch", "size_mismatch", "unsafe_layer", "unsupported",
                            "image_unavailable"})


Outcome = Ready | Failed


class Market:
    """The market round of one wake: made once, when the first new machine needs it (a
    planned one, or one replacing a stopped machine its worker has no room to start)."""

    def __init__(self, waker: Waker, config: AppConfig, region: str,
                 views: list[dict[str, Any]]) -> None:
        self.waker, self.config, self.region, self.views = waker, config, region, views
        self.lock = asyncio.Lock()  # one offer at a time: each sees the last's reservations
        self._round: asyncio.Future[Round | Failed] | None = None

    def round(self) -> asyncio.Future[Round | Failed]:
        if self._round is None:
            self._round = asyncio.ensure_future(
                self.waker._round(self.config, self.region, self.views))
        return self._round


class Waker:
    def __init__(
        self, fleet: Fleet, agents: AgentClient, placer: Placer, margin_ms: int,
        is_current: Callable[[AppConfig], bool],
    ) -> None:
        """`is_current(config)`: the app still exists as that incarnation (the store)."""
        self.fleet = fleet
        self.is_current = is_current
        self.agents = agents
        self.placer = placer
        self.margin_s = margin_ms / 1000
        self.claimed: dict[str, set[str]] = {}  # app -> machines a wake is starting
        self.placing: dict[str, int] = {}  # app -> new machines being placed (not yet offered)
        self.background: set[asyncio.Task[Outcome]] = set()

    async def close(self) -> None:
        for task in list(self.background):
            task.cancel()
        for task in list(self.background):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def wake(self, config: AppConfig, request: WakeRequest) -> WakeResponse:
        loop = asyncio.get_running_loop()
        answer_by = loop.time() + request.deadline_ms / 1000 - self.margin_s
        region = request.region or config.regions[0]
        try:
            # Plan from the registry's view (no round trip to the agents on the cold path):
            # starts are checked transitions at the agent, and start?wait_s accepts a
            # machine someone else started, so a stale view costs a failed start at most.
            async with asyncio.timeout_at(answer_by):
                everywhere = await self.fleet.live_workers()
                views = await self.fleet.registered_machines(config)
        except TimeoutError:
            raise PlacementError("no answer from the workers before the deadline",
                                 code="deadline", status=WAKE_ERRORS["deadline"]) from None
        here = {wid for wid, w in everywhere.items() if w.region == region}
        states = [MachineState(v["id"], v["worker"], v["state"]) for v in views]
        claimed = self.claimed.get(config.name, set())
        placing = self.placing.get(config.name, 0)
        plan = plan_wake(config, states, everywhere.keys(), request.count, claimed, placing,
                         region_workers=here)
        if plan.reuse:  # entries only while machines are claimed (see _restart)
            self.claimed.setdefault(config.name, set()).update(m.id for m in plan.reuse)
        if plan.new:
            self.placing[config.name] = placing + plan.new
        market = Market(self, config, region, views)
        work: list[Coroutine[Any, Any, Outcome]] = [
            self._restart(config.name, m, answer_by, market) for m in plan.reuse
        ]
        work += [self._start_new(config.name, market, answer_by) for _ in range(plan.new)]
        if not work:
            return await self._nothing_to_start(config, views, plan.shortfall)
        return await self._gather(work, answer_by, plan.shortfall)

    async def _round(
        self, config: AppConfig, region: str, views: list[dict[str, Any]]
    ) -> Round | Failed:
        try:
            return await self.placer.round(config, region, views)
        except PlacementError as exc:
            return Failed("no_capacity", f"cannot place: {exc.message}")

    async def _gather(
        self, work: list[Coroutine[Any, Any, Outcome]], answer_by: float, shortfall: str
    ) -> WakeResponse:
        tasks = [asyncio.create_task(w) for w in work]
        for task in tasks:  # tracked from the start: close() cancels them, whatever happens
            self.background.add(task)
            task.add_done_callback(self.background.discard)
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

    async def _nothing_to_start(
        self, config: AppConfig, views: list[dict[str, Any]], shortfall: str
    ) -> WakeResponse:
        started = [v for v in views if v["state"] == "started" and v.get("address")]
        if started:
            return WakeResponse(machines=[woken(v) for v in started], shortfall=shortfall)
        raise PlacementError(shortfall or f"app {config.name}: nothing to start",
                             code="no_capacity", status=WAKE_ERRORS["no_capacity"])

    async def _restart(self, app: str, machine: MachineState, answer_by: float,
                       market: Market) -> Outcome:
        """Start a stopped/suspended machine again (its image is already on the worker).
        A worker without room for it now declines: a new machine is placed elsewhere
        instead, and the stopped one is left as it is (for the reconciler to replace)."""
        began = time.perf_counter()
        try:
            url = await self.fleet.worker_url(machine.worker)
            outcome = await self._start_and_wait(url, machine.id, answer_by, began, 0.0)
        except PlacementError as exc:
            outcome = Failed("start_failed", f"{machine.id}: {exc.message}")
        finally:
            claimed = self.claimed.get(app, set())
            claimed.discard(machine.id)
            if not claimed:
                self.claimed.pop(app, None)
        if isinstance(outcome, Failed) and outcome.code == "declined":
            log.info("%s: worker %s has no room to start it now; placing another machine",
                     machine.id, machine.worker)
            self.placing[app] = self.placing.get(app, 0) + 1
            return await self._start_new(app, market, answer_by)
        return outcome

    async def _start_new(self, app: str, market: Market, answer_by: float) -> Outcome:
        began = time.perf_counter()
        try:
            rnd = await market.round()
            if isinstance(rnd, Failed):
                return rnd
            async with market.lock:
                placed = await self.placer.place(rnd, start=False)
        finally:
            # From here on the machine exists on an agent (or never will): no longer "placing".
            left = self.placing.get(app, 0) - 1
            if left > 0:
                self.placing[app] = left
            else:
                self.placing.pop(app, None)  # no entry per app ever woken: they drop to none
        if isinstance(placed, NoCapacity):
            return Failed("no_capacity", placed.reason)
        if not self.is_current(rnd.config):  # deleted (or re-made) while this was placed
            await self._release(placed.url, placed.view["id"])
            return Failed("no_capacity", f"app {app} was deleted while a machine was placed")
        place_ms = ms_since(began)
        pull_began = time.perf_counter()
        try:
            await self.fleet.pull(placed.url, rnd.image.ref)
        except PlacementError as exc:
            code = "image_unavailable" if exc.code in IMAGE_REFUSALS else "start_failed"
            return Failed(code, f"pull on {placed.worker}: {exc.message}")
        pull_ms = ms_since(pull_began)
        try:
            outcome = await self._start_and_wait(
                placed.url, placed.view["id"], answer_by, began, pull_ms
            )
        except PlacementError as exc:
            return Failed("start_failed", f"{placed.view['id']}: {exc.message}")
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
        # One round trip: the agent answers once the machine is started (or 408/409).
        params = {"wait_s": f"{min(remaining, 300.0):.3f}"}
        try:
            status, body = await self.agents.call(
                "POST", url, f"/v1/machines/{mid}/start", params=params, timeout_s=remaining + 1
            )
        except AgentUnreachable:
            return Failed("deadline", f"{mid}: no answer from its worker in time")
        if status == 200 and isinstance(body, dict):
            boot = boot_ms(body)
            place_ms = max(0.0, ms_since(began) - pull_ms - boot)
            return Ready(body, WakeTimings(place_ms, pull_ms, boot))
        if status == 408:
            return Failed("deadline", f"{mid} still starting")
        if status == 409 and isinstance(body, dict) and body.get("error") == "no_capacity":
            return Failed("declined", f"{mid}: {message_of(body)}")  # no room there now
        return Failed("start_failed", f"{mid}: {message_of(body)}")

    async def _release(self, url: str, machine_id: str) -> None:
        try:
            await self.agents.call("DELETE", url, f"/v1/machines/{machine_id}")
        except AgentUnreachable:
            log.warning("machine %s of a deleted app could not be destroyed now", machine_id)

    async def autostop(self, config: AppConfig, machine_id: str) -> dict[str, Any]:
        url = await self.fleet.locate(config, machine_id)
        views = await self.fleet.own_machines(config)
        states = [MachineState(v["id"], v["worker"], v["state"]) for v in views]
        decision = decide_autostop(config, states, machine_id)
        if isinstance(decision, Refuse):
            raise Conflict(decision.message, code=decision.code)
        action = "suspend" if decision.suspend else "stop"
        status, body = await self.agents.call("POST", url, f"/v1/machines/{machine_id}/{action}")
        if status != 200:
            raise AgentReplied(status, body)
        return body if isinstance(body, dict) else {}


def outcome_of(task: asyncio.Task[Outcome]) -> Outcome:
    """A start that crashed is one failed start, not a failed wake."""
    exc = task.exception()
    if exc is None:
        return task.result()
    log.error("a start of this wake failed", exc_info=exc)
    return Failed("start_failed", f"internal error: {exc!r}")


def woken(view: dict[str, Any]) -> WokenMachine:
    return WokenMachine(id=view["id"], address=view["address"], worker=view["worker"])


def total_ms(timings: WakeTimings) -> float:
    return timings.place_ms + timings.pull_ms + timings.boot_ms


def ms_since(began: float) -> float:
    return (time.perf_counter() - began) * 1000


def boot_ms(view: dict[str, Any]) -> float:
    """From the agent's events: the last `starting` to the `started` after it."""
    events = view.get("events") or []
    started_at = starting_at = None
    for event in events:
        if event.get("state") == "starting":
            starting_at, started_at = event["at"], None
        elif event.get("state") == "started" and starting_at is not None:
            started_at = event["at"]
    if starting_at is None or started_at is None:
        return 0.0
    return max(0.0, float(started_at - starting_at) * 1000)


def message_of(body: Any) -> str:
    return str(body.get("message", body)) if isinstance(body, dict) else str(body)
