"""The edge's shell: feeds events to the pure cores and carries out what they decide.

Warm path: route Host -> app, `balance.pick` a machine, forward. A request that
finds no machine is held: the cold path (edge/coldpath.py) feeds `AppWakes`
and carries out its effects, and hands released requests back here to be
forwarded. Where a request that lost its machine goes is
edge/core/exchange.py's rule. Every exchange ends in exactly one answer;
accounting (in-flight per machine, held counts, metrics, the access log) happens
in `exchange_ended` only. An answer the edge makes itself says a code and its
fixed message: the detail goes to the log, with the app and the request id
(`fail`). What is counted goes into plain values (each app's `stats`, `unrouted`,
the cold path's `shed`) that /metrics reads when scraped (edge/metrics.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
from collections.abc import Callable, Coroutine
from time import perf_counter
from typing import Any

from edge.adapters.accesslog import AccessLog
from edge.adapters.placement import PlacementClient
from edge.adapters.upstream import UpstreamPool
from edge.coldpath import ColdPath, logged_id
from edge.config import EdgeConfig
from edge.core import balance
from edge.core.appwake import AppWakes
from edge.core.clients import ClientTable
from edge.core.exchange import AGAIN, GIVE_UP, Event, after_connect_failure, after_loss
from edge.core.forwarding import (
    TrustedProxies,
    forwarded_for,
    forwarded_scheme_host,
    parse_networks,
)
from edge.core.framing import BODY_CHUNKED, BODY_LENGTH, hsts_value
from edge.core.parking import Parking
from edge.core.stats import AppStats
from edge.core.tunnels import ClientTunnels
from edge.errors import status_of
from edge.exchange import ClientSide, Exchange, Shell
from edge.housekeeping import Autostop, Suspects
from edge.loadshare import TTL_INTERVALS, LoadBoard, LoadShare
from edge.metrics import EdgeMetrics
from edge.routeguard import RouteGuard
from edge.view import AppEntry, MachineSlot, View

log = logging.getLogger("thaw.edge")


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
        self.pool = UpstreamPool(self)
        self.tunnels: ClientTunnels[Exchange] = ClientTunnels(config.max_tunnels_per_client)
        self.connections: set[ClientSide] = set()
        # idle keep-alive connections without a watchdog of their own: one sweep for all
        self.parking: Parking[ClientSide] = Parking(config.idle_timeout_s, config.watch_every_s)
        self.park_sweep: asyncio.TimerHandle | None = None
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
        self.placement = PlacementClient(config)
        self.cold = ColdPath(config, view, self.wakes, self.pool, self.trust, self.placement,
                             self.instance_id, self.random, self._forward, self._pick_tunnel,
                             self.fail, self.spawn)
        self.suspects = Suspects(view, self.placement, self.spawn, self.loop, self.instance_id)
        self.autostop = Autostop(view, self.placement, self.spawn, self.loop,
                                 config.autostop_interval_s, self.cold.room,
                                 fresh=self._loads_fresh, quiet=self._quiet)
        self.load_share: LoadShare | None = None  # shared with other edges (share_loads)
        # a barred client's packets dropped by the kernel too (edge/adapters/nftwall.py)
        self.bar_in_kernel: Callable[[str, float], None] | None = None
        self.route_guard = RouteGuard(config.route_keys)
        view.admit = self.route_guard
        self.metrics = EdgeMetrics(self)
        view.on_machine_removed = self.cold.machine_removed
        view.on_machine_added = self.cold.machine_added
        view.on_app_removed = self.cold.app_removed
        view.on_change = self._view_changed

    def share_loads(self, board: LoadBoard) -> LoadShare:
        """This edge's loads and demand shared through `board` with other edges', theirs
        counted at each machine (edge/loadshare.py); the caller starts and closes it."""
        self.load_share = LoadShare(self.view, board, self.instance_id, self.wakes.held,
                                    self.wakes.holds.apps, self.cold.room,
                                    self.config.load_share_interval_s, self._unused)
        ttl_s = self.config.load_share_interval_s * TTL_INTERVALS  # as the rounds' demand
        self.cold.demand_report = lambda app, demand: board.report(
            self.instance_id, app, demand, ttl_s)
        return self.load_share

    def _view_changed(self) -> None:
        """A machine or an app's settings changed: what a quiet edge's auto-stop timed its
        next pass on, and a machine another edge may already load."""
        self.autostop.wake()
        if self.load_share is not None:
            self.load_share.stir()

    def _unused(self) -> bool:
        """No client connection and nothing held: no request of this edge's anywhere."""
        return not self.connections and not self.wakes.total

    async def _loads_fresh(self) -> bool:
        """The other edges' loads as of now (none shared: known); False if they cannot be
        read now."""
        return self.load_share is None or await self.load_share.refresh()

    def _quiet(self) -> bool:
        """No request of this edge's and none of the others' on its machines: only time
        and the view change what auto-stop finds."""
        return self._unused() if self.load_share is None else self.load_share.quiet()

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
        if not self.connections:  # the first: auto-stop and the load share's rounds again
            self.autostop.wake()
            if self.load_share is not None:
                self.load_share.stir()
        self.connections.add(conn)
        return None

    def connection_closed(self, conn: ClientSide) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            if not conn.trusted:
                self.clients.close(conn.peer)
        self.parking.unpark(conn)

    def park(self, conn: ClientSide, idle_since: float) -> None:
        self.parking.park(conn, idle_since)
        if self.park_sweep is None:
            self.park_sweep = self.loop.call_later(self.config.watch_every_s, self._sweep_parked)

    def unpark(self, conn: ClientSide) -> None:
        self.parking.unpark(conn)

    def _sweep_parked(self) -> None:
        self.park_sweep = None
        for conn in self.parking.expired(self.loop.time()):
            conn.close_if_idle()
        if len(self.parking):
            self.park_sweep = self.loop.call_later(self.config.watch_every_s, self._sweep_parked)

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
            peer = conn.peer.decode("latin-1")
            log.warning("client %s cut for abuse: barred %.0fs", peer, bar)
            if self.bar_in_kernel is not None:
                self.bar_in_kernel(peer, bar)

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
            if app.h2c:
                self.fail(exchange, "upgrade_not_supported",
                          "the app's machines speak HTTP/2 (h2c): no WebSocket upgrade")
                return
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
            self.cold.hold(exchange, app)
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
        if not self.tunnels.take(exchange, self.cold.whose(exchange)):
            self.fail(exchange, "too_many_tunnels",
                      f"the client holds {self.tunnels.limit} WebSocket tunnels already")
            return
        slot = self._pick_tunnel(app)
        if slot is not None:
            self._forward(exchange, app, slot)
        elif any(m.in_flight < app.config.concurrency.hard_limit for m in app.routable):
            self.fail(exchange, "tunnels_full",
                      "every machine of the app holds its share of WebSocket tunnels")
        else:
            self.cold.hold(exchange, app)

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
        if app.h2c:
            self._forward_h2(exchange, app, slot)
            return
        conn = self.pool.acquire(slot.pool_key)
        if conn is not None:
            conn.send(exchange)
        else:
            exchange.to(Event.PICK)
            self.spawn(self._connect(exchange, app, slot))

    def _forward_h2(self, exchange: Exchange, app: AppEntry, slot: MachineSlot) -> None:
        """To a machine of an h2c app: a stream on its HTTP/2 connection."""
        conn = self.pool.h2pool().acquire(slot.pool_key)
        if conn is not None:
            conn.send(exchange)
        else:
            exchange.to(Event.PICK)
            self.spawn(self._connect(exchange, app, slot))

    async def _connect(self, exchange: Exchange, app: AppEntry, slot: MachineSlot) -> None:
        pool = self.pool.h2pool() if app.h2c else self.pool
        try:
            conn = await pool.connect(slot)
        except (OSError, TimeoutError) as exc:
            self._connect_failed(exchange, app, slot, exc)
            return
        if exchange.ended:
            pool.release(conn, True)  # type: ignore[arg-type]  # (its own pool's)
        else:
            conn.send(exchange)

    def _connect_failed(self, exchange: Exchange, app: AppEntry, slot: MachineSlot,
                        exc: BaseException) -> None:
        """Nothing was delivered, whatever the method: another machine, then a hold (the
        rule is `after_connect_failure`). The worker is reported as suspect."""
        app.stats.connect_errors += 1
        log.warning("connect to machine %s (%s) of app %s failed (request %s): %r", slot.id,
                    slot.address, app.name, logged_id(exchange), exc)
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
            self.cold.hold(exchange, app)

    def upstream_lost(self, exchange: Exchange, got_bytes: bool, reused: bool,
                      unprocessed: bool = False) -> None:
        """The machine's connection closed mid-exchange (the request may have been
        delivered): `after_loss` says whether it goes out again, waits, or ends in 502.
        `unprocessed`: the machine said it never acted on the request (an HTTP/2
        REFUSED_STREAM, a stream above its GOAWAY's last id) and the request is whole
        again in the exchange (`Exchange.unsend`): it may go again, whatever its method."""
        if exchange.ended:
            return
        slot = exchange.slot
        config = self.config
        resendable_now = exchange.resendable or (unprocessed and not exchange.response_started)
        where, counts = after_loss(resendable_now, got_bytes, reused, exchange.attempts,
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
            self.cold.hold(exchange, exchange.app)  # wait for a machine rather than 502

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
        if exchange.upgrade:
            self.tunnels.end(exchange)
        if app is None:
            return
        if exchange.held_at:  # (set on the first hold and kept: most requests skip this)
            self.wakes.forget(app.name, exchange)
        if exchange.slot is not None:
            if exchange.upgrade:  # a tunnel was in flight until now: idle from now on
                exchange.slot.last_start = self.loop.time()
            self._unslot(exchange)
            if self.wakes.total and self.wakes.held(app.name):
                self.cold.room(app)

    def count_rejected(self, code: str) -> None:
        """A connection refused before a request was made of it (no duration to speak of)."""
        self.unrouted.answered(status_of(code), 0.0)

    def fail(self, exchange: Exchange, code: str, detail: str) -> None:
        """End `exchange` with the edge's answer for `code`, which says the code and its
        fixed message only; `detail` (machines, addresses, placement's words) is logged
        with the app and the request id, at info for a 5xx and debug for a 4xx."""
        app = exchange.app
        log.log(logging.INFO if status_of(code) >= 500 else logging.DEBUG,
                "answered %s to request %s of app %s: %s", code, logged_id(exchange),
                app.name if app is not None else "-", detail)
        exchange.fail(code)

    async def stop_serving(self) -> None:
        """Answer every held request and stop taking new ones."""
        self.closing = True
        self.cold.stop()

    async def close(self) -> None:
        if self.park_sweep is not None:
            self.park_sweep.cancel()
            self.park_sweep = None
        await self.autostop.stop()
        await self.placement.close()
        if self.cold.thaw is not None:
            await self.cold.thaw.close()
        if self.access_log is not None:
            await self.access_log.close()

