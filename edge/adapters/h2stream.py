"""One HTTP/2 stream as the `Downstream` of its exchange (see edge/adapters/http2.py).

An `H2Stream` keeps what belongs to one stream — the answer's DATA waiting for
the client's window, its trailers, the request body's unacknowledged bytes and
why they are held back — and asks its connection (a `StreamOwner`) to send.
`StreamOwner` names what a stream may ask of its connection; `H2Connection`
fills it in (a base class rather than a typing Protocol, so that compiled calls
stay native, as edge/exchange.py's ports).
"""

from __future__ import annotations

import asyncio
from collections import deque

from edge.config import EdgeConfig
from edge.core.exchange import Phase
from edge.core.framing import BODY_LENGTH, HSTS, ResponseHead, sets_hsts
from edge.core.h2head import CONNECTION_SPECIFIC
from edge.core.h2wire import INTERNAL_ERROR, Events
from edge.errors import RETRY_AFTER, error_body, grpc_error_trailers, is_grpc, status_of
from edge.exchange import Downstream, Exchange

PAUSE_TUNNEL = 1 << 7  # a tunnel's early DATA waits for the machine's 101


class StreamOwner(Events):
    """What a stream may ask of its HTTP/2 connection (which also takes the protocol's
    events: one base, as compiled classes have one)."""

    config: EdgeConfig
    loop: asyncio.AbstractEventLoop
    peer: bytes
    trusted: bool
    hsts: bytes  # the Strict-Transport-Security value its answers get (b"": none)
    scheme: bytes
    write_paused: bool
    streams: dict[int, H2Stream]

    def send_headers(self, stream: H2Stream, headers: list[tuple[bytes, bytes]]) -> None:
        raise NotImplementedError

    def flush(self, stream: H2Stream, write: bool = True) -> None:
        raise NotImplementedError

    def reset(self, stream: H2Stream, code: int, after_end: bool = False) -> None:
        raise NotImplementedError

    def acknowledge(self, stream: H2Stream, size: int) -> None:
        raise NotImplementedError

    def stream_settled(self, stream: H2Stream) -> None:
        raise NotImplementedError


class H2Stream(Downstream):
    """One stream: the Downstream of its exchange."""

    def __init__(self, conn: StreamOwner, stream_id: int) -> None:
        self.conn = conn
        self.stream_id = stream_id
        self.peer = conn.peer
        self.trusted = conn.trusted
        self.scheme = conn.scheme
        self.write_paused = conn.write_paused
        self.exchange: Exchange | None = None
        self.out: deque[bytes] = deque()  # response DATA waiting for the client's window
        self.out_bytes = 0
        self.ending = False  # the response ended: END_STREAM once `out` is sent
        self.blocked = False  # reading from the machine is paused for this stream
        self.pause_reasons = 0
        self.unacked = 0  # request DATA received but not yet acknowledged
        self.trailers: list[tuple[bytes, bytes]] = []  # the answer's, sent at its end
        self.request_trailers = b""  # the client's, checked, for the machine
        self.body_open = False  # answered before the client sent its whole body
        # answered whole with the request still coming: when it stops waiting for the rest
        self.lingering: asyncio.TimerHandle | None = None
        self.declared = -1  # the request's content-length (-1: none), for what lingers
        self.received = 0  # request body bytes, for what lingers
        self.remote_ended = False  # the client ended its side (END_STREAM)
        self.tunnel = False  # an RFC 8441 WebSocket: after the machine's 101, DATA both ways
        self.early: list[bytes] = []  # a tunnel's DATA that came before the machine's 101
        self.sent_at = conn.loop.time()  # when DATA last went out (a stalled reader is reset)

    # -- the answer ----------------------------------------------------------------------

    def send_head(self, exchange: Exchange, status: int, head: ResponseHead) -> None:
        headers = [(b":status", b"%d" % status), *_header_pairs(head.forward)]
        if head.body == BODY_LENGTH:
            headers.append((b"content-length", b"%d" % head.content_length))
        if exchange.held_at:
            headers.append((b"server-timing", exchange.timing()))
        hsts = self.conn.hsts
        if hsts and not sets_hsts(head.forward):
            headers.append((HSTS, hsts))
        self.conn.send_headers(self, headers)

    def send_body(self, exchange: Exchange, data: bytes) -> None:
        if data and self.stream_id in self.conn.streams:  # (a stream gone takes nothing)
            self.out.append(data)
            self.out_bytes += len(data)
            self.conn.flush(self)

    def send_end(self, exchange: Exchange, trailers: bytes) -> None:
        self.trailers = [pair for pair in _header_pairs(trailers)
                         if pair[0] not in CONNECTION_SPECIFIC]
        self.ending = True
        self.conn.flush(self)

    def send_error(self, exchange: Exchange | None, code: str) -> None:
        if exchange is not None and is_grpc(exchange.head.forward):
            headers = [(b":status", b"200"), (b"content-type", b"application/grpc")]
            if code in RETRY_AFTER:
                headers.append((b"retry-after", b"%d" % self.conn.config.wake_retry_after_s))
            self.conn.send_headers(self, headers)
            self.trailers = list(grpc_error_trailers(code))
            self.ending = True
            self.conn.flush(self)
            return
        body = error_body(code)
        headers = [(b":status", b"%d" % status_of(code)), (b"content-type", b"application/json"),
                   (b"content-length", b"%d" % len(body))]
        if code in RETRY_AFTER:
            headers.append((b"retry-after", b"%d" % self.conn.config.wake_retry_after_s))
        self.conn.send_headers(self, headers)
        if exchange is None or exchange.method != b"HEAD":
            self.out.append(body)
            self.out_bytes += len(body)
        self.ending = True
        self.conn.flush(self)

    def cut(self, exchange: Exchange) -> None:
        self.conn.reset(self, INTERNAL_ERROR)

    # -- a WebSocket tunnel (RFC 8441) -----------------------------------------------------

    def open_tunnel(self, exchange: Exchange, head: ResponseHead) -> None:
        """The machine's 101 is the client's 200; what the client sent early goes on."""
        self.conn.send_headers(self, [(b":status", b"200"), *(
            pair for pair in _header_pairs(head.forward)
            if pair[0] not in CONNECTION_SPECIFIC and pair[0] != b"sec-websocket-accept")])
        early, self.early = self.early, []
        if early:
            exchange.to_machine(b"".join(early))
        self.unpause(PAUSE_TUNNEL)

    def tunnel_data(self, exchange: Exchange, data: bytes) -> None:
        self.send_body(exchange, data)

    def tunnel_in(self, exchange: Exchange, data: bytes, flow_length: int) -> None:
        """The client's DATA on a tunnel: to the machine, or kept (unacknowledged, so the
        client's window bounds it) until the machine's 101."""
        if exchange.phase == Phase.TUNNEL:
            exchange.to_machine(data)
        else:
            self.early.append(data)
            self.pause(PAUSE_TUNNEL)
        if self.pause_reasons:
            self.unacked += flow_length
        else:
            self.conn.acknowledge(self, flow_length)

    # -- the request body's flow control --------------------------------------------------

    def pause(self, reason: int) -> None:
        self.pause_reasons |= reason

    def unpause(self, reason: int) -> None:
        if not self.pause_reasons & reason:
            return
        self.pause_reasons &= ~reason
        if not self.pause_reasons and self.unacked:
            unacked, self.unacked = self.unacked, 0
            self.conn.acknowledge(self, unacked)

    def exchange_done(self, exchange: Exchange) -> None:
        # answered before the client sent all: stop it sending (once the answer is out)
        self.body_open = not (self.remote_ended if self.tunnel else exchange.body_done)
        if self.body_open:
            head = exchange.head
            self.declared = head.content_length if head.body == BODY_LENGTH else -1
            self.received = exchange.received
        self.exchange = None
        if self.tunnel and exchange.status == 101:  # the tunnel closed: END_STREAM
            self.send_end(exchange, b"")
            return
        self.conn.stream_settled(self)

    def set_blocked(self, blocked: bool) -> None:
        """Pause (resume) reading from the machine while the client cannot take more: its
        window is shut with `h2_stream_buffer_bytes` queued, or its connection is full."""
        self.blocked = blocked
        paused = blocked or self.conn.write_paused
        if paused == self.write_paused:
            return
        self.write_paused = paused
        exchange = self.exchange
        upstream = exchange.upstream if exchange is not None else None
        if upstream is not None:
            if paused:
                upstream.pause_reading()
            else:
                upstream.resume_reading()


def _header_pairs(forward: bytes) -> list[tuple[bytes, bytes]]:
    """`Name: value\\r\\n` lines as HTTP/2 header pairs (names lower-case)."""
    pairs = []
    for line in forward.split(b"\r\n"):
        name, sep, value = line.partition(b":")
        if sep:
            pairs.append((name.strip().lower(), value.strip()))
    return pairs

