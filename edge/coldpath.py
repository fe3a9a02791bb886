"""The edge's cold path: every event that matters to held requests — one found no
machine, placement answered or predicted a wake's start, a machine appeared or was lost,
a request ended and left room, a timer fired — goes to `AppWakes` (edge/core/appwake.py),
and this is the only place its effects (`CallPlacement`, `Release`, `Fail`, `Shed`,
`ArmTimer`) are carried out. A released request is handed back to the shell
(edge/service.py) to be forwarded, as any warm one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Protocol

from agent.api import MachineView
from edge.adapters.placement import PlacementClient
from edge.adapters.upstream import UpstreamPool
from edge.config import EdgeConfig
from edge.core import balance
from edge.core.appwake import AppWakes, Shape, machines_to_start
from edge.core.exchange import Event
from edge.core.forwarding import TrustedProxies
from edge.core.holdqueue import grpc_timeout_s, request_timeout_s
from edge.core.stats import AppStats
from edge.core.wakeeffects import ArmTimer, CallPlacement, Effect, Fail, Release, Shed
from edge.errors import EdgeError
from edge.exchange import Exchange
from edge.view import LOST, AppEntry, MachineSlot, View
from ground.logs import event
from ground.registry import MachineRecord
from ground.registry.types import boot_span_ms
from placement.api import MAX_DEMAND, WakePrediction, WakeRequest

log = logging.getLogger("thaw.edge")
wake_log = logging.getLogger("thaw.edge.wake")

Forward = Callable[[Exchange, AppEntry, MachineSlot], None]
PickTunnel = Callable[[AppEntry], MachineSlot | None]
FailWith = Callable[[Exchange, str, str], None]
Spawn = Callable[[Coroutine[Any, Any, None]], None]


class Thawer(Protocol):
    """Thaws a suspended machine through its agent (edge/adapters/thaw.py `AgentThaw`)."""

    @property
    def results(self) -> Mapping[str, int]: ...

    async def thaw(self, app: str, record: MachineRecord,
                   wait_s: float) -> MachineView | None: ...

    async def close(self) -> None: ...


THAW_WAIT_S = 10.0  # the longest the edge's own thaw waits for its machine (the wake goes on)
# The wake beside an edge's own thaw waits for the thaw's answer this long at most: on a
# small host the two at once share its cores with the agent at the moment the thaw needs
# them; a thaw that brought what the wake asks for answers it (`_thawed_enough`), and a
# wake sent after the machine is up finds it so and starts no other.
THAW_HEAD_START_S = 0.05
DEMAND_READ_S = 0.25  # the longest the thaw's answer to a wake waits for the load board
THAWED = "thawed"  # a wake answered by the edge's own thaw (placement not called)


class ColdPath:
    """Held requests and wakes: events in, `AppWakes`' effects carried out. What it
    asks of the shell: `forward` a released request to a machine, `pick_tunnel` for a
    released WebSocket upgrade, `fail` one the edge answers itself, `spawn` a task."""

    def __init__(self, config: EdgeConfig, view: View, wakes: AppWakes[Exchange],
                 pool: UpstreamPool, trust: TrustedProxies, placement: PlacementClient,
                 instance_id: str, rand: random.Random, forward: Forward,
                 pick_tunnel: PickTunnel, fail: FailWith, spawn: Spawn) -> None:
        self.config = config
        self.loop = asyncio.get_running_loop()
        self.view = view
        self.wakes = wakes
        self.pool = pool
        self.trust = trust
        self.placement = placement
        self.instance_id = instance_id
        self.random = rand  # the shell's: one source for every pick
        self.forward = forward
        self.pick_tunnel = pick_tunnel
        self.fail = fail
        self.spawn = spawn
        self.shed: Counter[tuple[str, str]] = Counter()  # (app, reason) -> requests shed
        self._timers: dict[str, asyncio.TimerHandle] = {}
        # thaws suspended machines through their agents beside a wake (None: only wakes)
        self.thaw: Thawer | None = None
        # apps with a thaw of the edge's own under way: set when it ends
        self._thawing: dict[str, asyncio.Event] = {}
        # with other edges: report this edge's demand of an app and read every edge's
        # (the load board's `report`); None: this edge alone
        self.demand_report: Callable[[str, int], Awaitable[int]] | None = None
        self.thaw_head_start_s = THAW_HEAD_START_S  # (tests on a loaded host: longer)

    def shape(self, app: AppEntry) -> Shape:
        config = app.config
        concurrency = config.concurrency
        return Shape(
            started=len(app.routable), in_flight=app.in_flight,
            free=balance.free_slots(app.routable, concurrency.hard_limit),
            over=balance.over_limit(app.routable, concurrency.hard_limit),
            soft_limit=concurrency.soft_limit, max_machines=config.max_machines,
            auto_start=config.auto_start, hold_timeout_s=config.hold_timeout_s,
            max_pending=config.max_pending,
            elsewhere=sum(m.elsewhere for m in app.routable),
        )

    def hold(self, exchange: Exchange, app: AppEntry) -> None:
        now = self.loop.time()
        since = exchange.held_at or None  # held again: the first deadline stands
        if not exchange.held_at:
            exchange.held_at = now
        exchange.to(Event.HOLD)
        self.run(self.wakes.hold(app.name, exchange, now, self.shape(app), since,
                                 client_timeout_s(exchange), self.whose(exchange)))

    def whose(self, exchange: Exchange) -> bytes | None:
        """Whose a request is, for the per-client bounds (held requests, tunnels): its
        peer, or the client a trusted proxy names; None for a trusted proxy's own (it
        speaks for many)."""
        client = exchange.client
        if not client.trusted:
            return client.peer
        named = self.trust.client(exchange.head.forwarded_for, client.peer, True)
        return None if self.trust.trusts(named) else named

    def room(self, app: AppEntry) -> None:
        """The app's machines may take more now (a request ended, a machine was kept)."""
        self.run(self.wakes.on_capacity(app.name, self.loop.time(), self.shape(app)))

    def machine_added(self, slot: MachineSlot, boot_ms: float) -> None:
        entry = self.view.apps.get(slot.app)
        if entry is not None:
            self.run(self.wakes.on_machine_added(slot.app, self.loop.time(), self.shape(entry),
                                                 boot_ms))

    def machine_removed(self, slot: MachineSlot) -> None:
        if slot.state == LOST:  # no answer will come: requests at it go out again
            self.pool.sever_address(slot.pool_key)
        else:  # stopping: what is at it finishes
            self.pool.close_address(slot.pool_key)
        entry = self.view.apps.get(slot.app)
        if entry is not None and self.wakes.held(slot.app):
            self.run(self.wakes.on_machine_lost(slot.app, self.loop.time(), self.shape(entry)))

    def app_removed(self, name: str) -> None:
        for key in [key for key in self.shed if key[0] == name]:
            del self.shed[key]  # its series go with it
        self.run(self.wakes.app_deleted(name, self.loop.time()))

    def stop(self) -> None:
        """Answer every held request (the edge stops taking new ones)."""
        self.run(self.wakes.shutdown(self.loop.time()))

    def _timer(self, token: str) -> None:
        self._timers.pop(token, None)
        entry = self.view.apps.get(token)
        self.run(self.wakes.on_timer(token, self.loop.time(),
                                     self.shape(entry) if entry is not None else None))

    def run(self, effects: list[Effect[Exchange]]) -> None:
        """Carry out what AppWakes decided, in order."""
        for effect in effects:
            if isinstance(effect, Release):
                self._release(effect)
            elif isinstance(effect, Fail):
                self._fail_held(effect)
            elif isinstance(effect, Shed):
                self._shed(effect)
            elif isinstance(effect, CallPlacement):
                self._thaw_beside(effect)
                self.spawn(self._wake(effect))
            elif isinstance(effect, ArmTimer):
                timer = self._timers.pop(effect.token, None)
                if timer is not None:
                    timer.cancel()
                if effect.at is not None:
                    self._timers[effect.token] = self.loop.call_at(effect.at, self._timer,
                                                                   effect.token)

    def _release(self, release: Release[Exchange]) -> None:
        app = self.view.apps.get(release.app)
        for released in release.items:
            exchange = released.item
            if exchange.ended:
                continue
            exchange.hold_s = released.hold_s
            exchange.wake = released.wake
            slot = None
            if app is not None:  # (the core counted the room: a slot is there)
                app.stats.hold.observe(released.hold_s)
                concurrency = app.config.concurrency
                slot = self.pick_tunnel(app) if exchange.upgrade else balance.pick(
                    app.routable, concurrency.soft_limit, concurrency.hard_limit, self.random)
            if app is None or slot is None:
                self.fail(exchange, "no_capacity", "no machine had room on release")
                continue
            self.forward(exchange, app, slot)

    def _fail_held(self, fail: Fail[Exchange]) -> None:
        live = [(e, waited) for e, waited in zip(fail.items, fail.waits, strict=True)
                if not e.ended]
        if not live:
            return
        entry = self.view.apps.get(fail.app)
        if fail.code == "hold_timeout" and entry is not None:
            for _, waited in live:
                entry.stats.hold.observe(waited)
        log.info("answered %s to %d requests of app %s (%s): %s", fail.code, len(live),
                 fail.app, " ".join(logged_id(e) for e, _ in live), fail.detail)
        for exchange, _ in live:
            exchange.fail(fail.code)

    def _shed(self, shed: Shed[Exchange]) -> None:
        """503 `predicted_late` now, rather than a 504 at their deadlines."""
        live = [(e, waited) for e, waited in zip(shed.items, shed.waits, strict=True)
                if not e.ended]
        if not live:
            return
        self.shed[(shed.app, "predicted_late")] += len(live)
        log.info("answered predicted_late to %d requests of app %s (%s): its machine is "
                 "predicted ready in %.3fs, after their deadlines", len(live), shed.app,
                 " ".join(logged_id(e) for e, _ in live), shed.wait_s)
        for exchange, waited in live:
            exchange.hold_s = waited
            exchange.shed(shed.retry_after_s)

    def _predicted(self, call: CallPlacement, prediction: WakePrediction) -> None:
        self.run(self.wakes.on_wake_predicted(call.wake, self.loop.time(),
                                              prediction.predicted_ms))

    def region_of(self, entry: AppEntry | None) -> str:
        """The region a wake asks for: the edge's, if the app runs there ("": primary)."""
        region = self.config.region
        return region if entry is None or region in entry.config.regions else ""

    def _thaw_beside(self, call: CallPlacement) -> None:
        """Beside the wake, the edge's own thaw of the suspended machine the wake would
        resume (edge/adapters/thaw.py), if there is one and none is under way."""
        entry = self.view.apps.get(call.app)
        if self.thaw is None or entry is None or call.app in self._thawing:
            return
        record = entry.to_thaw(self.region_of(entry))
        if record is not None:
            self._thawing[call.app] = asyncio.Event()
            self.spawn(self._thaw(call, record))
            slot = MachineSlot(call.app, record.id, record.address, record.state,
                               self.loop.time(), record.worker)
            if not entry.h2c and slot.port > 0:  # its first request's connection, opened
                self.spawn(self.pool.preconnect(slot))  # while it thaws

    async def _thaw(self, call: CallPlacement, record: MachineRecord) -> None:
        """Its machine, once its agent answers started, taken as any machine that appears:
        what it can take of the held requests is released (the wake waiting for this then
        is answered by it, or asks placement for more)."""
        assert self.thaw is not None
        try:
            view = await self.thaw.thaw(call.app, record,
                                        max(0.05, min(call.deadline_ms / 1000, THAW_WAIT_S)))
        except Exception:  # a bug must not leave the app's thaw under way for ever
            log.exception("app %s: thaw of machine %s failed", call.app, record.id)
            view = None
        finally:
            self._thawing.pop(call.app).set()
        entry = self.view.apps.get(call.app)
        if view is None or entry is None or entry.config.uid != record.app_uid:
            return
        before = entry.machines.get(view.id)
        if before is not None and before.routable:
            return  # the feed or the wake's answer brought it first
        slot = self.view.add_started(call.app, view.id, view.address, view.worker)
        if slot is not None and slot.routable:
            self.machine_added(slot, boot_span_ms((e.state, e.at) for e in view.events))

    async def _thawed_enough(self, call: CallPlacement, entry: AppEntry,
                             before: set[str]) -> bool:
        """Whether the edge's own thaw brought what the wake asks for — its machines (one:
        a wake beside a thaw asks for one when the requests held here fit on one), and
        room for every edge's demand of the app (with other edges: this one's reported on
        the load board and the sum read in one step, as a wake's sizing reads it; another
        edge resuming the same app meanwhile then sees both). Then the wake is answered
        by it and placement is not called; otherwise it goes to placement, which sizes it
        from every edge's demand. The board away: placement decides."""
        if len({slot.id for slot in entry.routable} - before) < call.count:
            return False
        # what the load share's rounds report: held and in flight here now (requests that
        # came during the thaw included), not only those the wake was sized from
        demand = max(call.demand, entry.in_flight + self.wakes.held(call.app))
        if self.demand_report is not None:
            try:
                async with asyncio.timeout(DEMAND_READ_S):
                    demand = await self.demand_report(call.app, demand)
            except Exception as exc:  # (Redis away or slow): placement sizes it, as before
                log.debug("app %s: demand not read for the thaw's answer: %r", call.app, exc)
                return False
            if self.view.apps.get(call.app) is not entry:  # (deleted or made anew)
                return False
        concurrency = entry.config.concurrency
        if machines_to_start(demand, len(entry.routable), concurrency.soft_limit,
                             entry.config.max_machines) > 0:
            return False
        added = len({slot.id for slot in entry.routable} - before)
        wake = call.wake
        took = self.loop.time() - wake.sent_at
        entry.stats.woke(THAWED, took, None)  # (the phases are placement's timings)
        event(wake_log, "wake", app=call.app, count=call.count, result=THAWED,
              machines=added, demand=demand, wake_ms=round(took * 1000, 1),
              boot_ms=round(wake.boot_ms, 1), held=self.wakes.held(call.app))
        self.run(self.wakes.on_wake_answer(wake, self.loop.time(), self.shape(entry), added,
                                           wake.place_ms, wake.pull_ms, wake.boot_ms))
        return True

    async def _wake(self, call: CallPlacement) -> None:
        """Placement's answer to one wake, fed back to AppWakes."""
        name = call.app
        entry = self.view.apps.get(name)
        # Judge "did this wake add anything" against what was routable when it was asked
        # for: the registry feed (or the edge's own thaw) may bring the woken machines
        # before the answer arrives.
        before = {slot.id for slot in entry.routable} if entry is not None else set()
        deadline_ms = call.deadline_ms
        thawing = self._thawing.get(name)
        if thawing is not None:  # the edge's own thaw first (THAW_HEAD_START_S)
            began = self.loop.time()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(thawing.wait(), self.thaw_head_start_s)
            entry = self.view.apps.get(name)
            if entry is not None and await self._thawed_enough(call, entry, before):
                return
            entry = self.view.apps.get(name)
            deadline_ms = max(1, deadline_ms - int((self.loop.time() - began) * 1000))
        region = self.region_of(entry)
        request = WakeRequest(count=call.count, deadline_ms=deadline_ms, region=region,
                              demand=min(call.demand, MAX_DEMAND), edge=self.instance_id)
        stats = entry.stats if entry is not None else AppStats()
        started = self.loop.time()
        try:
            answer = await self.placement.wake(
                name, request, deadline_ms / 1000 + self.config.wake_grace_s,
                lambda prediction: self._predicted(call, prediction))
        except EdgeError as exc:
            took = self.loop.time() - started
            stats.woke(exc.code, took, None)
            event(wake_log, "wake", logging.WARNING, app=name, count=call.count,
                  result=exc.code, wake_ms=round(took * 1000, 1), held=self.wakes.held(name),
                  message=exc.message)
            thawing = self._thawing.get(name)
            if thawing is not None:  # the thaw may yet bring the machine: its answer first
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(thawing.wait(), THAW_WAIT_S + 1)
            entry = self.view.apps.get(name)
            if entry is None:
                self.run(self.wakes.app_deleted(name, self.loop.time()))
            else:
                self.run(self.wakes.on_wake_failed(call.wake, self.loop.time(),
                                                   self.shape(entry), exc.code, exc.message))
            return
        timings = answer.timings
        took = self.loop.time() - started
        stats.woke("ok", took, (timings.place_ms, timings.pull_ms, timings.boot_ms))
        predicted_ms, ready_ms = call.wake.measured_ms()
        event(wake_log, "wake", app=name, count=call.count, result="ok",
              machines=len(answer.machines), wake_ms=round(took * 1000, 1),
              place_ms=round(timings.place_ms, 1), pull_ms=round(timings.pull_ms, 1),
              boot_ms=round(timings.boot_ms, 1), held=self.wakes.held(name),
              predicted_ms=round(predicted_ms, 1),
              ready_ms=round(ready_ms if ready_ms >= 0 else took * 1000, 1),
              shortfall=answer.shortfall)
        entry = self.view.apps.get(name)
        if entry is None:  # deleted meanwhile: its held requests were answered 404
            return
        # machines this edge saw refuse connects: placement may not know yet; trying them
        # again is fine, counting them as new would ask again at once for the same
        seen_dead = {m.id for m in answer.machines if (name, m.id) in self.view.tombstones}
        for machine in answer.machines:
            self.view.add_started(name, machine.id, machine.address, machine.worker)
        added = len({m.id for m in answer.machines} - before - seen_dead)
        self.run(self.wakes.on_wake_answer(call.wake, self.loop.time(), self.shape(entry),
                                           added, timings.place_ms, timings.pull_ms,
                                           timings.boot_ms))


def client_timeout_s(exchange: Exchange) -> float | None:
    """The client's bound on its wait: the shortest of X-Thaw-Hold-Timeout-Ms,
    X-Request-Timeout and a gRPC call's grpc-timeout (read only once a request is held:
    the warm path never looks)."""
    head = exchange.head
    given = [t for t in (head.hold_timeout_s, request_timeout_s(head.forward),
                         grpc_timeout_s(head.forward)) if t is not None]
    return min(given) if given else None


def logged_id(exchange: Exchange) -> str:
    """The id a request is logged by: the edge's (made when it is routed), else the
    client's, else "-"."""
    return (exchange.request_id or exchange.head.request_id or b"-").decode("latin-1")
