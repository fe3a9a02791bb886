"""The edge's shell: feeds events to the pure cores and carries out what they decide.

Warm path: route Host -> app, `balance.pick` a machine, forward. Cold path:
hold (`HoldQueues`), wake through placement (single flight, `scaling`),
release held requests as machines take them, expire the late ones. Every
exchange ends in exactly one answer; accounting (in-flight per machine, held
counts, metrics) happens in `exchange_ended` only. An answer the edge makes
itself says a code and its fixed message: the detail goes to the log, with
the app and the request id (`fail`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
from typing import TYPE_CHECKING

from edge.config import EdgeConfig
from edge.core import balance
from edge.core.framing import BODY_CHUNKED, BODY_LENGTH
from edge.core.holdqueue import HoldQueues, Rejected
from edge.core.scaling import AppLoad, next_wake
from edge.errors import status_of
from edge.exchange import CONNECTING, DONE, HELD, Exchange
from edge.metrics import EdgeMetrics
from edge.upstream import UpstreamPool
from edge.view import AppEntry, MachineSlot, View
from edge.wake import Waker
from placement.api import WakeTimings

if TYPE_CHECKING:
    from edge.client import ClientConnection

log = logging.getLogger("thaw.edge")

HOLD_SWEEP_S = 0.05


class Edge:
    def __init__(self, config: EdgeConfig, view: View, waker_factory: type[Waker] = Waker) -> None:
        self.config = config
        self.loop = asyncio.get_running_loop()
        self.view = view
        self.metrics = EdgeMetrics()
        self.holds: HoldQueues[Exchange] = HoldQueues(config.max_held_total)
        self.pool = UpstreamPool(self)
        self.connections: set[ClientConnection] = set()
        self.random = random.Random()
        self.tasks: set[asyncio.Task[None]] = set()
        self.waker = waker_factory(self)
        self.closing = False
        self._ids = itertools.count(1)
        self.instance_id = os.urandom(4).hex()  # names this edge (request ids, reports)
        self._id_prefix = self.instance_id.encode()
        self._sweeper: asyncio.TimerHandle | None = None
        view.on_machine_removed = self._machine_removed

    def spawn(self, coro: object) -> None:
        task: asyncio.Task[None] = self.loop.create_task(coro)  # type: ignore[arg-type]
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # -- routing and dispatch ------------------------------------------------------------

    def dispatch(self, exchange: Exchange) -> None:
        """Start an exchange that reached the head of its connection's queue."""
        if self.closing:
            self.fail(exchange, "shutting_down", "the edge is shutting down")
            return
        app = exchange.app
        if app is None:
            app = self.view.route(exchange.head.host)
            if app is None:
                self.fail(exchange, "unknown_app", f"no app serves host {exchange.head.host!r}")
                return
            exchange.app = app
            exchange.upstream_head = self._upstream_head(exchange)
        config = app.config.concurrency
        slot = balance.pick(app.routable, config.soft_limit, config.hard_limit, self.random)
        if slot is None:
            self._hold(exchange, app)
        else:
            self._forward(exchange, app, slot)

    def _upstream_head(self, exchange: Exchange) -> bytes:
        head = exchange.head
        request_id = head.request_id or b"%s-%x" % (self._id_prefix, next(self._ids))
        exchange.request_id = request_id
        peer = exchange.client.peer
        forwarded_for = head.forwarded_for + b", " + peer if head.forwarded_for else peer
        if head.body == BODY_LENGTH:
            framing = b"Content-Length: %d\r\n" % head.content_length
        elif head.body == BODY_CHUNKED:
            framing = b"Transfer-Encoding: chunked\r\n"
        else:
            framing = b""
        return b"".join((
            exchange.method, b" ", head.target, b" HTTP/1.1\r\nHost: ", head.authority,
            b"\r\n", head.forward, b"X-Forwarded-For: ", forwarded_for,
            b"\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: ", head.authority,
            b"\r\nX-Request-Id: ", request_id, b"\r\n", framing, b"\r\n",
        ))

    def _forward(self, exchange: Exchange, app: AppEntry, slot: MachineSlot) -> None:
        slot.in_flight += 1
        slot.last_start = self.loop.time()
        app.in_flight += 1
        exchange.slot = slot
        conn = self.pool.acquire(slot.address)
        if conn is not None:
            conn.send(exchange)
        else:
            exchange.state = CONNECTING
            self.spawn(self._connect(exchange, app, slot))

    async def _connect(self, exchange: Exchange, app: AppEntry, slot: MachineSlot) -> None:
        try:
            conn = await self.pool.connect(slot)
        except (OSError, TimeoutError) as exc:
            self._connect_failed(exchange, app, slot, exc)
            return
        if exchange.state == DONE:
            self.pool.release(conn, True)
        else:
            conn.send(exchange)

    def _connect_failed(self, exchange: Exchange, app: AppEntry, slot: MachineSlot,
                        exc: BaseException) -> None:
        """Nothing was delivered, whatever the method: try another machine; after
        `max_connect_attempts`, hold it and wake (never a 502 while a machine may yet
        come: the hold's deadline bounds the wait). The worker is reported as suspect."""
        self.metrics.connect_errors.labels(app.name).inc()
        log.warning("connect to machine %s (%s) of app %s failed (request %s): %r", slot.id,
                    slot.address, app.name, _request_id(exchange), exc)
        self.view.mark(slot, "gone")
        self.waker.suspect(slot, exc)
        if exchange.state == DONE:
            return
        self._unslot(exchange)
        exchange.attempts += 1
        if exchange.attempts >= self.config.max_connect_attempts:
            self._hold(exchange, app)
        else:
            self.dispatch(exchange)

    def upstream_lost(self, exchange: Exchange, got_bytes: bool, reused: bool = False) -> None:
        """The machine's connection closed mid-exchange (the request may have been
        delivered). A *pooled* connection lost before any byte came back says nothing of
        the machine (an idle keep-alive it closed, or a machine that died since): it does
        not count as an attempt, and its idle siblings are dropped as likely stale too."""
        if exchange.state == DONE:
            return
        slot = exchange.slot
        if not got_bytes and exchange.retryable:
            if reused and slot is not None:
                self.pool.close_address(slot.address)
            else:
                exchange.attempts += 1
            self._unslot(exchange)
            exchange.upstream = None
            if exchange.attempts < self.config.max_connect_attempts:
                self.dispatch(exchange)
                return
            if exchange.app is not None:
                self._hold(exchange, exchange.app)  # wait for a machine rather than 502
                return
        machine = f"machine {slot.id} ({slot.address})" if slot is not None else "the machine"
        self.fail(exchange, "bad_gateway", f"{machine} closed the connection before answering")

    def _unslot(self, exchange: Exchange) -> None:
        slot = exchange.slot
        if slot is not None:
            exchange.slot = None
            slot.in_flight -= 1
            if exchange.app is not None:
                exchange.app.in_flight -= 1

    # -- endings -------------------------------------------------------------------------

    def exchange_ended(self, exchange: Exchange, answered: bool) -> None:
        """Accounting of an exchange that answered, or whose client went away first."""
        app = exchange.app
        if answered:
            self.metrics.requests.add(app.name if app else "", exchange.status)
        if app is None:
            return
        # Not "if state == HELD": finish() marks the exchange DONE before this runs, and a
        # held request can end early (bad body, client gone). held_at is set on the first
        # hold and never cleared, so a request never held skips the lookup.
        holds = self.holds
        if exchange.held_at:
            holds.remove(app.name, exchange)
        if exchange.slot is not None:
            self._unslot(exchange)
            if holds.total and holds.held(app.name):
                self.release_held(app)

    def count_rejected(self, code: str) -> None:
        self.metrics.requests.add("", status_of(code))

    def fail(self, exchange: Exchange, code: str, detail: str) -> None:
        """End `exchange` with the edge's answer for `code`, which says the code and its
        fixed message only; `detail` (machines, addresses, placement's words) is logged
        with the app and the request id, at info for a 5xx and debug for a 4xx."""
        app = exchange.app
        log.log(logging.INFO if status_of(code) >= 500 else logging.DEBUG,
                "answered %s to request %s of app %s: %s", code, _request_id(exchange),
                app.name if app is not None else "-", detail)
        exchange.fail(code, detail)

    def fail_all(self, app: str, exchanges: list[Exchange], code: str, detail: str) -> None:
        """`fail` for many requests of `app` at once, in one log line."""
        exchanges = [e for e in exchanges if e.state != DONE]
        if exchanges:
            log.info("answered %s to %d requests of app %s (%s): %s", code, len(exchanges), app,
                     " ".join(_request_id(e) for e in exchanges), detail)
        for exchange in exchanges:
            exchange.fail(code, detail)

    # -- the cold path -------------------------------------------------------------------

    def _hold(self, exchange: Exchange, app: AppEntry) -> None:
        config = app.config
        if not config.auto_start and not app.routable:
            self.fail(exchange, "auto_start_off", "auto_start is off and no machine is started")
            return
        now = self.loop.time()
        # A request held again (its machine refused it after a wake) keeps its first
        # deadline: the budget is per request, not per hold.
        spent_s = now - exchange.held_at if exchange.held_at else 0.0
        client_s = exchange.head.hold_timeout_s
        decision = self.holds.enqueue(
            app.name, exchange, now, max(0.0, config.hold_timeout_s - spent_s),
            config.max_pending, None if client_s is None else max(0.0, client_s - spent_s),
        )
        if isinstance(decision, Rejected):
            self.fail(exchange, decision.reason, f"{self.holds.held(app.name)} requests held "
                      f"for the app, {self.holds.total} in all")
            return
        exchange.state = HELD
        if not exchange.held_at:
            exchange.held_at = now
        self._arm_sweeper()
        if config.auto_start:
            self.maybe_wake(app)

    def maybe_wake(self, app: AppEntry) -> None:
        load = AppLoad(
            in_flight=app.in_flight, held=self.holds.held(app.name), started=len(app.routable),
            starting=app.starting, soft_limit=app.config.concurrency.soft_limit,
            max_machines=app.config.max_machines, wake_in_flight=app.wake_in_flight,
        )
        count = next_wake(load)
        if count > 0 and self.loop.time() >= self.waker.backoff_until.get(app.name, 0.0):
            app.wake_in_flight = True
            app.starting = count
            self.spawn(self.waker.wake(app, count))

    def release_held(self, app: AppEntry, timings: WakeTimings | None = None) -> None:
        """Held requests of `app`, oldest first, as many as its machines can take."""
        concurrency = app.config.concurrency
        capacity = balance.free_slots(app.routable, concurrency.hard_limit)
        if capacity <= 0:
            return
        now = self.loop.time()
        for exchange in self.holds.release(app.name, capacity):
            if exchange.state == DONE:  # answered while held; never forward it
                continue
            slot = balance.pick(app.routable, concurrency.soft_limit, concurrency.hard_limit,
                                self.random)
            if slot is None:  # cannot happen: capacity was counted above
                self.fail(exchange, "no_capacity", "no machine had room on release")
                continue
            hold_s = now - exchange.held_at
            self.metrics.hold_seconds.labels(app.name).observe(hold_s)
            wake_timings = timings or self.waker.last_timings(app, exchange)
            exchange.timing = server_timing(hold_s, wake_timings)
            self._forward(exchange, app, slot)

    def fail_held_by_name(self, app: str, code: str, detail: str) -> None:
        self.fail_all(app, self.holds.fail_all(app), code, detail)

    def _arm_sweeper(self) -> None:
        """Next sweep at the earliest hold deadline (a 504 is not late), and at most
        HOLD_SWEEP_S away (the sweep also releases to machines the registry reported)."""
        at = self.loop.time() + HOLD_SWEEP_S
        deadline = self.holds.next_deadline()
        if deadline is not None:
            at = min(at, deadline)
        if self._sweeper is not None:
            if self._sweeper.when() <= at:
                return
            self._sweeper.cancel()
        self._sweeper = self.loop.call_at(at, self._sweep)

    def _sweep(self) -> None:
        self._sweeper = None
        for expired in self.holds.expire(self.loop.time()):
            self.metrics.hold_seconds.labels(expired.app).observe(expired.waited_s)
            self.fail(expired.item, "hold_timeout",
                      f"no machine could take the request within {expired.waited_s:.3f}s")
        for name in self.holds.apps():
            entry = self.view.apps.get(name)
            if entry is None:
                self.fail_held_by_name(name, "unknown_app", "the app was deleted")
                continue
            self.release_held(entry)  # machines may have appeared through the registry
            if entry.config.auto_start:
                self.maybe_wake(entry)
        if self.holds.total:
            self._arm_sweeper()

    def _machine_removed(self, slot: MachineSlot) -> None:
        self.pool.close_address(slot.address)

    async def stop_serving(self) -> None:
        """Answer every held request and stop taking new ones."""
        self.closing = True
        for name in self.holds.apps():
            entry = self.view.apps.get(name)
            self.fail_all(name, self.holds.release(name, self.holds.held(name)),
                          "shutting_down", "the edge is stopping")
            if entry is not None:
                entry.wake_in_flight = False
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None


def _request_id(exchange: Exchange) -> str:
    """The id a request is logged by: the edge's (made when it is routed), else the
    client's, else "-"."""
    return (exchange.request_id or exchange.head.request_id or b"-").decode("latin-1")


def server_timing(hold_s: float, timings: WakeTimings | None) -> bytes:
    """`hold;dur=X, place;dur=Y, pull;dur=Z, boot;dur=W` in milliseconds."""
    timings = timings or WakeTimings()
    return b"hold;dur=%.1f, place;dur=%.1f, pull;dur=%.1f, boot;dur=%.1f" % (
        hold_s * 1000.0, timings.place_ms, timings.pull_ms, timings.boot_ms,
    )
