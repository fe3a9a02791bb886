"""One request/response exchange between a client side and a machine, and the three small
Protocols the data path's pieces meet through.

    adapters (http1, upstream, …) ──▶ exchange (this module) ◀── service (the shell)

An `Exchange` talks to its client side through `Downstream` (an HTTP/1.1
connection, or one HTTP/2 stream: it frames the answer for its protocol) and
to its machine through `Upstream`; it and the adapters report to the shell
through `Shell`: three small ports, each a base class the other side fills
in. None of them imports the shell, so the arrows go one way (tests/unit/
test_edge_imports.py checks there is no cycle). Its phase moves only along
edge/core/exchange.py's table.

Bodies are never buffered whole: while no upstream is attached the request
body is kept up to `body_buffer_bytes` and the client's reading is paused
beyond that.
"""

from __future__ import annotations

import asyncio
from time import perf_counter
from typing import Protocol

from edge.config import EdgeConfig
from edge.core.clients import ClientState
from edge.core.exchange import (
    AFTER_END,
    AFTER_HEAD,
    AFTER_SEND,
    FORWARDING,
    NEW,
    RESPONDING,
    TERMINAL,
    TUNNEL,
    Event,
    IllegalTransition,
    Phase,
    advance,
    resendable,
)
from edge.core.forwarding import TrustedProxies
from edge.core.framing import BODY_LENGTH, BODY_NONE, RequestHead, ResponseHead
from edge.core.wakeeffects import Wake, server_timing
from edge.errors import status_of
from edge.view import AppEntry, MachineSlot

# why a client's reading is paused (PAUSE_TURN: its client began its share of requests in
# this turn of the loop, edge/core/clients.py)
PAUSE_PIPELINE, PAUSE_BUFFER, PAUSE_UPSTREAM, PAUSE_TURN = 1, 2, 4, 8
# A held request the app's predicted start would not be in time for (edge/core/appwake.py
# `Shed`): 503 with the predicted wait as Retry-After. Made here because its Retry-After is
# the request's own, not the configured one that every other error answer carries.
PREDICTED_LATE = "predicted_late"
PREDICTED_LATE_BODY = (b'{"error": "predicted_late", "message": "the app is starting and '
                       b'will not be ready within this request\'s deadline"}')


# The three ports are plain base classes, not typing Protocols, so that compiled (mypyc)
# calls through them stay native vtable calls on the warm path; each names only what the
# other side may use, and nothing here imports the classes that fill them in.


class Downstream:
    """The client side of one exchange (an HTTP/1.x connection, or one HTTP/2 stream)."""

    peer: bytes  # the client's address, for X-Forwarded-For
    trusted: bool  # the peer is a trusted proxy (edge/core/forwarding.py)
    scheme: bytes  # b"http" or b"https", for X-Forwarded-Proto
    write_paused: bool  # the client reads slower than the machine answers

    def send_head(self, exchange: Exchange, status: int, head: ResponseHead) -> None:
        raise NotImplementedError

    def send_body(self, exchange: Exchange, data: bytes) -> None:
        raise NotImplementedError

    def send_end(self, exchange: Exchange, trailers: bytes) -> None:
        """The answer ends, with its trailer fields (`Name: value\r\n` lines) if any."""
        raise NotImplementedError

    def send_error(self, exchange: Exchange, code: str) -> None:
        raise NotImplementedError

    def open_tunnel(self, exchange: Exchange, head: ResponseHead) -> None:
        """The machine switched protocols (101): answer so, then carry bytes both ways."""
        raise NotImplementedError

    def tunnel_data(self, exchange: Exchange, data: bytes) -> None:
        raise NotImplementedError

    def cut(self, exchange: Exchange) -> None:
        """An answer begun that cannot end well: the client must see it cut."""
        raise NotImplementedError

    def pause(self, reason: int) -> None:
        """Stop reading the request for `reason` (PAUSE_*) until `unpause(reason)`."""
        raise NotImplementedError

    def unpause(self, reason: int) -> None:
        raise NotImplementedError

    def exchange_done(self, exchange: Exchange) -> None:
        raise NotImplementedError


class Upstream:
    """A machine's side of one exchange: an HTTP/1.1 connection, or one stream of an
    HTTP/2 one (an app whose protocol is h2c). It frames the request for its protocol."""

    def send_request(self, exchange: Exchange) -> None:
        """Send the exchange's head (`upstream_head`, as HTTP/1.1) and whatever body it
        has kept (`chunks`, and its end when `body_done`, with `trailers`)."""
        raise NotImplementedError

    def send_data(self, exchange: Exchange, data: bytes) -> None:
        """More of the request body (never empty)."""
        raise NotImplementedError

    def send_end(self, exchange: Exchange, trailers: bytes) -> None:
        """The request body ends, with its trailer fields (`Name: value\r\n` lines)."""
        raise NotImplementedError

    def write(self, data: bytes) -> None:
        """Bytes as they are: a tunnel's, after the machine's 101."""
        raise NotImplementedError

    def pause_reading(self) -> None:
        raise NotImplementedError

    def resume_reading(self) -> None:
        raise NotImplementedError

    def abandon(self) -> None:
        raise NotImplementedError


class ClientSide(Protocol):
    """A client connection, as the shell sees it: who it is, and how it stops."""

    peer: bytes
    trusted: bool
    # its client's state in the edge's ClientTable, for its share of each loop turn (set
    # by Shell.connection_opened; None: no share to keep, a trusted proxy's or one alone)
    share: ClientState | None

    def close_if_idle(self) -> bool: ...
    def abort_transport(self) -> None: ...


class Shell:
    """What the data path reports to the edge's shell."""

    config: EdgeConfig
    loop: asyncio.AbstractEventLoop
    closing: bool  # the edge is stopping: new requests get 503
    trust: TrustedProxies  # peers believed about the client (edge/core/forwarding.py)
    hsts: bytes  # the Strict-Transport-Security value of answers over TLS (b"": none)

    def dispatch(self, exchange: Exchange) -> None:
        raise NotImplementedError

    def exchange_ended(self, exchange: Exchange, answered: bool) -> None:
        raise NotImplementedError

    def upstream_lost(self, exchange: Exchange, got_bytes: bool, reused: bool,
                      unprocessed: bool = False) -> None:
        raise NotImplementedError

    def park(self, conn: ClientSide, idle_since: float) -> None:
        """An idle connection stopped its own watchdog: the shell closes it once it has
        been idle `idle_timeout_s` (`close_if_idle`), unless it reads again first."""
        raise NotImplementedError

    def unpark(self, conn: ClientSide) -> None:
        raise NotImplementedError

    def fail(self, exchange: Exchange, code: str, detail: str) -> None:
        raise NotImplementedError

    def count_rejected(self, code: str) -> None:
        raise NotImplementedError

    def connection_opened(self, conn: ClientSide, new: bool = True) -> str | None:
        """None: the connection is taken; else why its client may not have it (the
        connection is then refused and closed). `new=False`: handed over between
        protocols, not a new connection."""
        raise NotImplementedError

    def client_arrives(self, peer: bytes) -> bool:
        """A TLS connection from `peer`, before its handshake: whether it may go on (its
        client is not barred nor over its new connections). Its protocol, once the
        handshake is done, is counted with `connection_opened(new=False)`."""
        raise NotImplementedError

    def client_reset(self, conn: ClientSide) -> bool:
        """A stream reset by or because of the connection's client: False when that goes
        over the client's budget (the connection is then cut)."""
        raise NotImplementedError

    def client_struck(self, conn: ClientSide) -> None:
        """The connection was cut for abuse (a budget spent): its client is barred."""
        raise NotImplementedError

    def connection_closed(self, conn: ClientSide) -> None:
        raise NotImplementedError

    def turn_left(self, conn: ClientSide) -> int:
        """How many requests the connection's client may still begin in this turn of the
        loop (edge/core/clients.py)."""
        raise NotImplementedError

    def turn_take(self, conn: ClientSide, count: int = 1) -> bool:
        """`count` requests of the connection's client begin in this turn: False if its
        client has not that many left (they wait, unread, for a later turn)."""
        raise NotImplementedError


class Exchange:
    __slots__ = (
        "app", "attempts", "body_done", "buffered", "chunks", "client", "close_after", "code",
        "error", "head", "held_at", "hold_s", "http10", "lost_on", "method", "phase",
        "progress_at", "received", "request_id", "resends", "sent", "sent_all", "shell",
        "slot", "started", "status", "trailers", "upgrade", "upstream", "upstream_head",
        "wake",
    )

    def __init__(self, shell: Shell, client: Downstream, method: bytes, head: RequestHead,
                 keep_alive: bool, http10: bool) -> None:
        self.started = perf_counter()  # for its duration (metrics, access log)
        self.shell = shell
        self.client = client
        self.method = method
        self.head = head
        self.http10 = http10
        self.close_after = not keep_alive
        self.app: AppEntry | None = None
        self.slot: MachineSlot | None = None
        self.upstream: Upstream | None = None
        self.phase: Phase = NEW
        self.body_done = head.body == BODY_NONE
        self.sent_all = False
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.received = 0  # request body (or tunnel) bytes from the client
        self.sent = 0  # response body (or tunnel) bytes from the machine
        self.code = ""  # the edge's own answer, when it made one (edge/errors.py codes)
        self.attempts = 0
        self.resends = 0  # times sent again after a machine lost it (after_loss)
        self.lost_on: tuple[MachineSlot, ...] = ()  # machines that lost it (fresh connection)
        self.held_at = 0.0  # loop time it was first held (0: never)
        self.hold_s = 0.0  # how long it was held in all, when released
        self.wake: Wake | None = None  # the wake whose machine took it, for Server-Timing
        self.status = 0
        self.error: tuple[str, str] | None = None
        self.request_id = b""
        self.upstream_head = b""
        self.progress_at = 0.0  # loop time bytes last moved while forwarding (response timeout)
        self.upgrade = False  # asks to upgrade to WebSocket: a 101 opens a tunnel
        self.trailers = b""  # the request's trailer fields (HTTP/2), for a chunked body's end

    def timing(self) -> bytes:
        """The Server-Timing of a request that was held: its hold and its wake's phases."""
        return server_timing(self.hold_s, self.wake)

    def to(self, event: Event) -> None:
        self.phase = advance(self.phase, event)

    @property
    def ended(self) -> bool:
        return self.phase in TERMINAL

    @property
    def response_started(self) -> bool:
        phase = self.phase
        return phase in (RESPONDING, TUNNEL)

    @property
    def resendable(self) -> bool:
        """May be sent again after delivery (see edge/core/exchange.py)."""
        return resendable(self.method, self.head.body, self.response_started)

    # -- request body, from the client side ----------------------------------------------

    def feed_body(self, data: bytes) -> None:
        if not data:  # (an empty chunk upstream would end a chunked body)
            return
        self.received += len(data)
        upstream = self.upstream
        phase = self.phase
        # (while the machine answers too: a full-duplex call — gRPC's bidirectional
        # streams — goes on sending after the response began)
        if upstream is not None and phase in (FORWARDING, RESPONDING):
            self.progress_at = self.shell.loop.time()
            upstream.send_data(self, data)
        elif phase not in TERMINAL:
            self.chunks.append(data)
            self.buffered += len(data)
            if self.buffered > self.shell.config.body_buffer_bytes:
                self.client.pause(PAUSE_BUFFER)

    def end_body(self, trailers: bytes = b"") -> None:
        """The request body is all in; `trailers` (checked `Name: value\r\n` lines) end a
        chunked one."""
        if self.body_done:  # once: a second chunked end would be a request of its own
            return
        self.body_done = True
        self.trailers = trailers
        upstream = self.upstream
        phase = self.phase
        if upstream is not None and phase in (FORWARDING, RESPONDING):
            upstream.send_end(self, trailers)
            self.sent_all = True

    def unsend(self, chunks: list[bytes]) -> None:
        """The machine never processed the request (it refused the stream, or went away
        before reaching it): the body it was sent is kept again, ahead of what came
        since, for the next machine."""
        if not chunks:
            return
        self.chunks = chunks + self.chunks
        self.buffered += sum(len(chunk) for chunk in chunks)
        self.sent_all = False
        if self.buffered > self.shell.config.body_buffer_bytes:
            self.client.pause(PAUSE_BUFFER)

    def attach(self, upstream: Upstream) -> None:
        """An upstream connection is ready: send the head and whatever body is buffered."""
        phase = AFTER_SEND[self.phase]
        if phase is None:
            raise IllegalTransition(self.phase, Event.SEND)
        self.phase = phase
        self.upstream = upstream
        client = self.client
        self.progress_at = self.shell.loop.time()
        self.sent_all = self.body_done
        upstream.send_request(self)
        if self.buffered:
            self.chunks = []
            self.buffered = 0
            client.unpause(PAUSE_BUFFER)
        if client.write_paused:
            upstream.pause_reading()

    # -- response, from the upstream side ------------------------------------------------

    def response_head(self, status: int, head: ResponseHead) -> None:
        phase = AFTER_HEAD[self.phase]
        if phase is None:
            raise IllegalTransition(self.phase, Event.HEAD)
        self.phase = phase
        self.status = status
        self.progress_at = self.shell.loop.time()
        self.client.send_head(self, status, head)

    def response_body(self, data: bytes) -> None:
        self.progress_at = self.shell.loop.time()
        self.sent += len(data)
        self.client.send_body(self, data)

    def response_end(self, trailers: bytes = b"") -> None:
        self.upstream = None
        self.client.send_end(self, trailers)
        phase = AFTER_END[self.phase]
        if phase is None:
            raise IllegalTransition(self.phase, Event.END)
        self._ended(phase)

    # -- a tunnel, after a 101 (WebSocket) ----------------------------------------------------

    def upgraded(self, head: ResponseHead) -> None:
        self.to(Event.UPGRADE)
        self.status = 101
        self.progress_at = self.shell.loop.time()
        self.close_after = True  # the connection is the tunnel's now
        self.client.open_tunnel(self, head)

    def to_client(self, data: bytes) -> None:
        self.progress_at = self.shell.loop.time()
        self.sent += len(data)
        self.client.tunnel_data(self, data)

    def to_machine(self, data: bytes) -> None:
        upstream = self.upstream
        if upstream is not None and self.phase == TUNNEL:
            self.progress_at = self.shell.loop.time()
            self.received += len(data)
            upstream.write(data)

    def tunnel_closed(self) -> None:
        """The machine closed its side: the client's closes after what is written."""
        self.upstream = None
        self.finish(Event.END)

    def close_tunnel(self) -> None:
        """The client closed its side (or the tunnel sat idle): so does the machine's."""
        upstream = self.upstream
        self.upstream = None
        if upstream is not None:
            upstream.abandon()
        self.finish(Event.END)

    def upstream_busy(self, busy: bool) -> None:
        """The machine's connection cannot take more now (or can again): stop (resume)
        reading the request from the client."""
        if busy:
            self.client.pause(PAUSE_UPSTREAM)
        else:
            self.client.unpause(PAUSE_UPSTREAM)

    # -- endings -------------------------------------------------------------------------

    def fail(self, code: str) -> None:
        """End with the edge's answer for `code` (or a cut once response bytes went out)."""
        if self.phase in TERMINAL:
            return
        self.code = code
        upstream = self.upstream
        self.upstream = None
        if upstream is not None:
            upstream.abandon()
        if self.response_started:
            self.close_after = True
            self.client.cut(self)
        else:
            if not self.body_done:
                self.close_after = True
            self.status = status_of(code)
            self.client.send_error(self, code)
        self.finish(Event.FAIL)

    def shed(self, retry_after_s: int) -> None:
        """End a request that was held with 503 `predicted_late` and `Retry-After`."""
        if self.phase in TERMINAL:
            return
        self.code = PREDICTED_LATE
        self.status = 503
        if not self.body_done:
            self.close_after = True
        client = self.client
        body = PREDICTED_LATE_BODY
        client.send_head(self, 503, ResponseHead(
            BODY_LENGTH, len(body), False,
            b"Content-Type: application/json\r\nRetry-After: %d\r\n" % retry_after_s))
        if self.method != b"HEAD":
            client.send_body(self, body)
        client.send_end(self, b"")
        self.finish(Event.FAIL)

    def finish(self, event: Event) -> None:
        if self.phase not in TERMINAL:
            self._ended(advance(self.phase, event))

    def _ended(self, phase: Phase) -> None:
        self.phase = phase
        client = self.client
        # The machine's backpressure no longer applies once this exchange is over
        # (fail() may have abandoned the upstream before it could unpause the client).
        client.unpause(PAUSE_UPSTREAM)
        if self.buffered:  # a body kept for a machine it never reached (shed, failed)
            self.chunks = []
            self.buffered = 0
            client.unpause(PAUSE_BUFFER)
        self.shell.exchange_ended(self, True)
        client.exchange_done(self)

    def abort(self) -> None:
        """The client went away: stop everything this exchange holds."""
        if self.phase in TERMINAL:
            return
        upstream = self.upstream
        self.upstream = None
        if upstream is not None:
            upstream.abandon()
        self.phase = advance(self.phase, Event.CLIENT_GONE)
        self.shell.exchange_ended(self, False)
