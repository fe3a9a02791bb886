"""The edge's shell: feeds events to the pure cores and carries out what they decide.

Warm path: route Host -> app, `balance.pick` a machine, forward. Cold path:
every event that matters to held requests — one found no machine, placement
answered or predicted a wake's start, a machine appeared or was lost, a request
ended and left room, a timer fired — goes to `AppWakes` (edge/core/appwake.py),
and this is the only place its effects (`CallPlacement`, `Release`, `Fail`,
`Shed`, `ArmTimer`) are carried out. Where a request that lost its machine goes
is edge/core/exchange.py's rule. Every exchange ends in exactly one answer;
accounting (in-flight per machine, held counts, metrics, the access log) happens
in `exchange_ended` only. An answer the edge makes itself says a code and its
fixed message: the detail goes to the log, with the app and the request id
(`fail`). What is counted goes into plain values (each app's `stats`, `unrouted`,
`shed`) that /metrics reads when scraped (edge/metrics.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
from collections import Counter
from collections.abc import Coroutine
from time import perf_counter
from typing import Any

from edge.adapters.accesslog import AccessLog
from edge.adapters.placement import PlacementClient
from edge.adapters.upstream import UpstreamPool
from edge.config import EdgeConfig
from edge.core import balance
from edge.core.appwake import AppWakes, Shape
from edge.core.clients import ClientTable
from edge.core.exchange import AGAIN, GIVE_UP, Event, after_connect_failure, after_loss
from edge.core.forwarding import (
    TrustedProxies,
    forwarded_for,
    forwarded_scheme_host,
    parse_networks,
)
from edge.core.framing import BODY_CHUNKED, BODY_LENGTH, hsts_value
from edge.core.holdqueue import request_timeout_s
from edge.core.stats import AppStats
from edge.core.wakeeffects import ArmTimer, CallPlacement, Effect, Fail, Release, Shed
from edge.errors import EdgeError, status_of
from edge.exchange import ClientSide, Exchange, Shell
from edge.housekeeping import Autostop, Suspects
from edge.loadshare import LoadBoard, LoadShare
from edge.metrics import EdgeMetrics
from edge.routeguard import RouteGuard
from edge.view import LOST, AppEntry, MachineSlot, View
from ground.logs import event
from placement.api import MAX_DEMAND, WakePrediction, WakeRequest

log = logging.getLogger("thaw.edge")
wake_log = logging.getLogger("thaw.edge.wake")


UNSHARED = 1 << 16  # client_requests_per_turn this large or more: no share is kept


class Edge(Shell):
    def __init__(self, config: EdgeConfig, view: View) -> None:
        self.config = config
        self.loop = asyncio.get_running_loop()
        self.view = view
        self.unrouted = AppStats()  # answers to requests that routed to no app
        self.access_log: AccessLog | None = None
        if config.access_log:
            self.access_log = AccessLog(config.access_log, config.access_log_sample_rate,
                                        self.loop)
        self.wakes: AppWakes[Exchange] = AppWakes(
            config.max_held_total, max_held_share=config.max_held_share,
            max_held_per_client=config.max_held_per_client)
        self.shed: Counter[tuple[str, str]] = Counter()  # (app, reason) -> requests shed
        self.pool = UpstreamPool(self)
        self.connections: set[ClientSide] = set()
        self.random = random.Random()
        self.tasks: set[asyncio.Task[None]] = set()
        self.closing = False
        self.trust = TrustedProxies(parse_networks(config.trusted_proxies))
        self.hsts = hsts_value(config.tls.hsts_max_age_s if config.tls is not None else 0)
        self.clients = ClientTable(config.max_conns_per_client, config.new_conns_per_s,
                                   config.h2_client_resets_per_s,
                                   conns_burst=config.new_conns_burst,
                                   per_turn=config.client_requests_per_turn)
        self.turn = 0  # the loop's turns in which a client began a request (turn_take)
        self.turn_ends = False  # end_turn is queued
        # a share of UNSHARED requests a turn or more is none: no connection keeps one
        self._turn_shares = config.client_requests_per_turn < UNSHARED
        self._ids = itertools.count(1)
        self.instance_id = os.urandom(4).hex()  # names this edge (request ids, reports)
        self._id_prefix = self.instance_id.encode()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.placement = PlacementClient(config)
        self.suspects = Suspects(view, self.placement, self.spawn, self.loop, self.instance_id)
        self.autostop = Autostop(view, self.placement, self.spawn, self.loop,
                                 config.autostop_interval_s, self._room)
        self.load_share: LoadShare | None = None  # shared with other edges (share_loads)
        self.route_guard = RouteGuard(config.route_keys)
        view.admit = self.route_guard
        self.metrics = EdgeMetrics(self)
        view.on_machine_removed = self._machine_removed
        view.on_machine_added = self._machine_added
        view.on_app_removed = self._app_removed

    def share_loads(self, board: LoadBoard) -> LoadShare:
        """This edge's loads and demand shared through `board` with other edges', theirs
        counted at each machine (edge/loadshare.py); the caller starts and closes it."""
        self.load_share = LoadShare(self.view, board, self.instance_id, self.wakes.held,
                                    self.wakes.holds.apps, self._room,
                                    self.config.load_share_interval_s)
        return self.load_share

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def connection_opened(self, conn: ClientSide, new: bool = True) -> str | None:
        if not conn.trusted:
            refused = self.clients.open(conn.peer, self.loop.time(), new)
            if refused is not None:
                return refused
            if self._turn_shares:
                conn.share = self.clients.state(conn.peer)
        self.connections.add(conn)
        return None

    def connection_closed(self, conn: ClientSide) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            if not conn.trusted:
                self.clients.close(conn.peer)

    def turn_left(self, conn: ClientSide) -> int:
        share = conn.share
        if share is None or share.open < 2:  # (see turn_take)
            return UNSHARED
        return self.clients.turn_left(share, self.turn)

    def turn_take(self, conn: ClientSide, count: int = 1) -> bool:
        share = conn.share
        if share is None or share.open < 2:
            # a trusted proxy's (it speaks for many clients), or its client's only
            # connection: its HTTP/1 requests come one at a time, and an HTTP/2
            # connection's streams are taken REQUESTS_PER_TURN a turn anyway; nothing to
            # share, and nothing to pay for it on the warm path
            return True
        if not self.turn_ends:  # the turn ends with the callbacks queued in it
            self.turn_ends = True
            self.loop.call_soon(self.end_turn)
        return self.clients.take_turn(share, self.turn, count)

    def end_turn(self) -> None:
        """The loop's turn in which clients began requests is over (the loop runs this
        once in the next turn, queued by the turn's first request)."""
        self.turn += 1
        self.turn_ends = False

    def client_arrives(self, peer: bytes) -> bool:
        return self.trust.trusts(peer) or self.clients.arrive(peer, self.loop.time()) is None

    def client_reset(self, conn: ClientSide) -> bool:
        return conn.trusted or self.clients.reset(conn.peer, self.loop.time())

    def client_struck(self, conn: ClientSide) -> None:
        if not conn.trusted:
            bar = self.clients.strike(conn.peer, self.loop.time())
            log.warning("client %s cut for abuse: barred %.0fs", conn.peer.decode("latin-1"),
                        bar)

    # -- routing and dispatch ------------------------------------------------------------

    def dispatch(self, exchange: Exchange) -> None:
        """Start an exchange that reached the head of its connection's queue (or that
        lost its machine and goes out again)."""
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
        if exchange.upgrade:
            self._dispatch_tunnel(exchange, app)
            return
        config = app.config.concurrency
        if exchange.lost_on:
            slot = balance.pick_avoiding(app.routable, config.soft_limit, config.hard_limit,
                                         self.random, exchange.lost_on)
        else:
            slot = balance.pick(app.routable, config.soft_limit, config.hard_limit,
                                self.random)
        if slot is None:
            self._hold(exchange, app)
        else:
            self._forward(exchange, app, slot)

    def _pick_tunnel(self, app: AppEntry) -> MachineSlot | None:
        hard = app.config.concurrency.hard_limit
        return balance.pick_tunnel(app.routable,
                                   balance.tunnel_limit(hard, self.config.tunnel_share), hard)

    def _dispatch_tunnel(self, exchange: Exchange, app: AppEntry) -> None:
        """A WebSocket upgrade: to the machine with the fewest tunnels under its tunnel
        limit. With every machine at that limit but with room for requests, 503
        tunnels_full: idle tunnels never take a machine's last places from requests. With
        no room at all, held as any request (its demand can wake a machine)."""
        slot = self._pick_tunnel(app)
        if slot is not None:
            self._forward(exchange, app, slot)
        elif any(m.in_flight < app.config.concurrency.hard_limit for m in app.routable):
            self.fail(exchange, "tunnels_full",
                      "every machine of the app holds its share of WebSocket tunnels")
        else:
            self._hold(exchange, app)

    def _upstream_head(self, exchange: Exchange) -> bytes:
        head = exchange.head
        request_id = head.request_id or b"%s-%x" % (self._id_prefix, next(self._ids))
        exchange.request_id = request_id
        client = exchange.client
        peer, trusted = client.peer, client.trusted
        chain = forwarded_for(head.forwarded_for, peer, trusted)
        real_ip = self.trust.client(head.forwarded_for, peer, trusted)
        scheme, host = client.scheme, head.authority
        if trusted:  # what the proxy in front says, when it is a scheme and a host
            scheme, host = forwarded_scheme_host(head.forwarded_proto, head.forwarded_host,
                                                 scheme, host)
        if head.body == BODY_LENGTH:
            framing = b"Content-Length: %d\r\n" % head.content_length
        elif head.body == BODY_CHUNKED:
            framing = b"Transfer-Encoding: chunked\r\n"
        else:
            framing = b""
        return b"".join((
            exchange.method, b" ", head.target, b" HTTP/1.1\r\nHost: ", head.authority,
            b"\r\n", head.forward, b"X-Forwarded-For: ", chain, b"\r\nX-Real-IP: ", real_ip,
            b"\r\nX-Forwarded-Proto: ", scheme, b"\r\nX-Forwarded-Host: ", host,
            b"\r\nX-Request-Id: ", request_id, b"\r\n", framing,
            b"Connection: Upgrade\r\nUpgrade: websocket\r\n" if exchange.upgrade else b"",
            b"\r\n",
        ))

    def _forward(self, exchange: Exchange, app: AppEntry, slot: MachineSlot) -> None:
        slot.in_flight += 1
        if exchange.upgrade:
            slot.tunnels += 1
        slot.last_start = self.loop.time()
        app.in_flight += 1
        exchange.slot = slot
        conn = self.pool.acquire(slot.pool_key)
        if conn is not None:
            conn.send(exchange)
        else:
            exchange.to(Event.PICK)
            self.spawn(self._connect(exchange, app, slot))

    async def _connect(self, exchange: Exchange, app: AppEntry, slot: MachineSlot) -> None:
        try:
            conn = await self.pool.connect(slot)
        except (OSError, TimeoutError) as exc:
            self._connect_failed(exchange, app, slot, exc)
            return
        if exchange.ended:
            self.pool.release(conn, True)
        else:
            conn.send(exchange)

    def _connect_failed(self, exchange: Exchange, app: AppEntry, slot: MachineSlot,
                        exc: BaseException) -> None:
        """Nothing was delivered, whatever the method: another machine, then a hold (the
        rule is `after_connect_failure`). The worker is reported as suspect."""
        app.stats.connect_errors += 1
        log.warning("connect to machine %s (%s) of app %s failed (request %s): %r", slot.id,
                    slot.address, app.name, _request_id(exchange), exc)
        self.view.mark(slot, "gone")
        self.suspects.report(slot, exc)
        if exchange.ended:
            return
        self._unslot(exchange)
        exchange.to(Event.RETRY)
        exchange.attempts += 1
        if after_connect_failure(exchange.attempts, self.config.max_connect_attempts) == AGAIN:
            self.dispatch(exchange)
        else:
            self._hold(exchange, app)

    def upstream_lost(self, exchange: Exchange, got_bytes: bool, reused: bool) -> None:
        """The machine's connection closed mid-exchange (the request may have been
        delivered): `after_loss` says whether it goes out again, waits, or ends in 502."""
        if exchange.ended:
            return
        slot = exchange.slot
        config = self.config
        where, counts = after_loss(exchange.resendable, got_bytes, reused, exchange.attempts,
                                   config.max_connect_attempts, exchange.resends,
                                   config.max_resends)
        if where == GIVE_UP or exchange.app is None:
            machine = f"machine {slot.id} ({slot.address})" if slot is not None else "a machine"
            sent = f" (sent {exchange.resends + 1} times)" if exchange.resends else ""
            self.fail(exchange, "bad_gateway",
                      f"{machine} closed the connection before answering{sent}")
            return
        exchange.resends += 1
        if reused and slot is not None:
            self.pool.close_address(slot.pool_key)  # its idle siblings are likely stale too
        if counts:
            exchange.attempts += 1
            if slot is not None:  # sent again elsewhere while there is an elsewhere
                exchange.lost_on = (*exchange.lost_on, slot)
        self._unslot(exchange)
        exchange.upstream = None
        exchange.to(Event.RETRY)
        if where == AGAIN:
            self.dispatch(exchange)
        else:
            self._hold(exchange, exchange.app)  # wait for a machine rather than 502

    def _unslot(self, exchange: Exchange) -> None:
        slot = exchange.slot
        if slot is not None:
            exchange.slot = None
            slot.in_flight -= 1
            if exchange.upgrade:
                slot.tunnels -= 1
            if exchange.app is not None:
                exchange.app.in_flight -= 1

    # -- endings -------------------------------------------------------------------------

    def exchange_ended(self, exchange: Exchange, answered: bool) -> None:
        """Accounting of an exchange that answered, or whose client went away first."""
        app = exchange.app
        seconds = perf_counter() - exchange.started
        if answered:
            (app.stats if app is not None else self.unrouted).answered(exchange.status, seconds)
        if self.access_log is not None:
            self.access_log.record(exchange, answered, seconds)
        if app is None:
            return
        if exchange.held_at:  # (set on the first hold and kept: most requests skip this)
            self.wakes.forget(app.name, exchange)
        if exchange.slot is not None:
            if exchange.upgrade:  # a tunnel was in flight until now: idle from now on
                exchange.slot.last_start = self.loop.time()
            self._unslot(exchange)
            if self.wakes.total and self.wakes.held(app.name):
                self._room(app)

    def count_rejected(self, code: str) -> None:
        """A connection refused before a request was made of it (no duration to speak of)."""
        self.unrouted.answered(status_of(code), 0.0)

    def fail(self, exchange: Exchange, code: str, detail: str) -> None:
        """End `exchange` with the edge's answer for `code`, which says the code and its
        fixed message only; `detail` (machines, addresses, placement's words) is logged
        with the app and the request id, at info for a 5xx and debug for a 4xx."""
        app = exchange.app
        log.log(logging.INFO if status_of(code) >= 500 else logging.DEBUG,
                "answered %s to request %s of app %s: %s", code, _request_id(exchange),
                app.name if app is not None else "-", detail)
        exchange.fail(code)

    # -- the cold path: events to AppWakes, its effects carried out -----------------------

    def shape(self, app: AppEntry) -> Shape:
        config = app.config
        concurrency = config.concurrency
        return Shape(
            started=len(app.routable), in_flight=app.in_flight,
            free=balance.free_slots(app.routable, concurrency.hard_limit),
            soft_limit=concurrency.soft_limit, max_machines=config.max_machines,
            auto_start=config.auto_start, hold_timeout_s=config.hold_timeout_s,
            max_pending=config.max_pending,
            elsewhere=sum(m.elsewhere for m in app.routable),
        )

    def _hold(self, exchange: Exchange, app: AppEntry) -> None:
        now = self.loop.time()
        since = exchange.held_at or None  # held again: the first deadline stands
        if not exchange.held_at:
            exchange.held_at = now
        exchange.to(Event.HOLD)
        self.run(self.wakes.hold(app.name, exchange, now, self.shape(app), since,
                                 client_timeout_s(exchange), self._held_by(exchange)))

    def _held_by(self, exchange: Exchange) -> bytes | None:
        """Whose a held request is, for the per-client bound: its peer, or the client a
        trusted proxy names; None for a trusted proxy's own (it speaks for many)."""
        client = exchange.client
        if not client.trusted:
            return client.peer
        named = self.trust.client(exchange.head.forwarded_for, client.peer, True)
        return None if self.trust.trusts(named) else named

    def _room(self, app: AppEntry) -> None:
        """The app's machines may take more now (a request ended, a machine was kept)."""
        self.run(self.wakes.on_capacity(app.name, self.loop.time(), self.shape(app)))

    def _machine_added(self, slot: MachineSlot, boot_ms: float) -> None:
        entry = self.view.apps.get(slot.app)
        if entry is not None:
            self.run(self.wakes.on_machine_added(slot.app, self.loop.time(), self.shape(entry),
                                                 boot_ms))

    def _machine_removed(self, slot: MachineSlot) -> None:
        if slot.state == LOST:  # no answer will come: requests at it go out again
            self.pool.sever_address(slot.pool_key)
        else:  # stopping: what is at it finishes
            self.pool.close_address(slot.pool_key)
        entry = self.view.apps.get(slot.app)
        if entry is not None and self.wakes.held(slot.app):
            self.run(self.wakes.on_machine_lost(slot.app, self.loop.time(), self.shape(entry)))

    def _app_removed(self, name: str) -> None:
        for key in [key for key in self.shed if key[0] == name]:
            del self.shed[key]  # its series go with it
        self.run(self.wakes.app_deleted(name, self.loop.time()))

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
                slot = self._pick_tunnel(app) if exchange.upgrade else balance.pick(
                    app.routable, concurrency.soft_limit, concurrency.hard_limit, self.random)
            if app is None or slot is None:
                self.fail(exchange, "no_capacity", "no machine had room on release")
                continue
            self._forward(exchange, app, slot)

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
                 fail.app, " ".join(_request_id(e) for e, _ in live), fail.detail)
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
                 " ".join(_request_id(e) for e, _ in live), shed.wait_s)
        for exchange, waited in live:
            exchange.hold_s = waited
            exchange.shed(shed.retry_after_s)

    def _predicted(self, call: CallPlacement, prediction: WakePrediction) -> None:
        self.run(self.wakes.on_wake_predicted(call.wake, self.loop.time(),
                                              prediction.predicted_ms))

    async def _wake(self, call: CallPlacement) -> None:
        """Placement's answer to one wake, fed back to AppWakes."""
        name = call.app
        region = self.config.region
        entry = self.view.apps.get(name)
        if entry is not None and region not in entry.config.regions:
            region = ""
        request = WakeRequest(count=call.count, deadline_ms=call.deadline_ms, region=region,
                              demand=min(call.demand, MAX_DEMAND), edge=self.instance_id)
        # Judge "did this wake add anything" against what was routable when it was sent:
        # the registry feed may report the woken machines before the answer arrives.
        before = {slot.id for slot in entry.routable} if entry is not None else set()
        stats = entry.stats if entry is not None else AppStats()
        started = self.loop.time()
        try:
            answer = await self.placement.wake(
                name, request, call.deadline_ms / 1000 + self.config.wake_grace_s,
                lambda prediction: self._predicted(call, prediction))
        except EdgeError as exc:
            took = self.loop.time() - started
            stats.woke(exc.code, took, None)
            event(wake_log, "wake", logging.WARNING, app=name, count=call.count,
                  result=exc.code, wake_ms=round(took * 1000, 1), held=self.wakes.held(name),
                  message=exc.message)
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

    async def stop_serving(self) -> None:
        """Answer every held request and stop taking new ones."""
        self.closing = True
        self.run(self.wakes.shutdown(self.loop.time()))

    async def close(self) -> None:
        await self.autostop.stop()
        await self.placement.close()
        if self.access_log is not None:
            await self.access_log.close()


def client_timeout_s(exchange: Exchange) -> float | None:
    """The client's bound on its wait: the shorter of X-Thaw-Hold-Timeout-Ms and
    X-Request-Timeout (read only once a request is held: the warm path never looks)."""
    head = exchange.head
    given = [t for t in (head.hold_timeout_s, request_timeout_s(head.forward)) if t is not None]
    return min(given) if given else None


def _request_id(exchange: Exchange) -> str:
    """The id a request is logged by: the edge's (made when it is routed), else the
    client's, else "-"."""
    return (exchange.request_id or exchange.head.request_id or b"-").decode("latin-1")
