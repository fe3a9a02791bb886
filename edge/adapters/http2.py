"""HTTP/2 front door: h2c with prior knowledge, or h2 chosen by ALPN over TLS.

edge/core/h2proto.py keeps the protocol's state (frames, streams, flow control,
HPACK, the frame budgets); this module maps streams to exchanges — each stream is
an `Exchange` whose `Downstream` is an `H2Stream`, routed, held, woken and released
like an HTTP/1.1 request; machines are still spoken to in HTTP/1.1 over the
keep-alive pool.

- Routing: `:authority` only; a `Host` header that names another host is a
  stream error (RST_STREAM PROTOCOL_ERROR). The head goes through the same
  `RequestHeadReader` as HTTP/1.1 (limits, underscores, X-Request-Id, …); a
  body of unknown length goes upstream chunked; cookies are joined again.
- Flow control both ways. Request bodies: DATA is acknowledged (WINDOW_UPDATE)
  only once it went to the machine — while the exchange is held, buffering
  past `body_buffer_bytes`, or the machine's connection is full, the bytes
  stay unacknowledged, so the client stops at its window. Responses: DATA goes
  out within the client's window; past `h2_stream_buffer_bytes` queued for a
  stream, reading from its machine pauses until the client opens its window.
- Limits (edge/core/h2budget.py and our SETTINGS): concurrent streams,
  header list size, resets, CONTINUATION frames and header block bytes,
  SETTINGS / PING / PRIORITY / WINDOW_UPDATE rates, empty frames. A
  connection over budget gets GOAWAY ENHANCE_YOUR_CALM; its exchanges are
  cancelled upstream and it closes.
- Trailers pass both ways (a client's end the chunked body upstream, checked; a
  machine's go out as a trailing HEADERS frame).
- WebSockets over HTTP/2 (RFC 8441, SETTINGS_ENABLE_CONNECT_PROTOCOL): a CONNECT
  with `:protocol: websocket` goes to the machine as an HTTP/1.1 upgrade (with a
  Sec-WebSocket-Key of the edge's); its 101 becomes a 200 and the stream a tunnel,
  DATA both ways under flow control, END_STREAM from either side closing it.
- An answer sent whole before the client sent all of its request: the stream
  lingers up to LINGER_S for the rest, its DATA acknowledged and dropped but its
  frames still checked (a body past or short of its content-length, trailers
  that do not end it, a window past 2^31-1 are stream errors, as RFC 9113 has
  them whether or not an answer went out); then RST_STREAM NO_ERROR (8.1) if
  the client has not ended it.
- Not done: server push (disabled).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from typing import cast

from edge.adapters.h2stream import H2Stream, StreamOwner
from edge.core.clients import ClientState
from edge.core.exchange import Phase
from edge.core.framing import BODY_LENGTH
from edge.core.h2budget import FrameBudget, Limits
from edge.core.h2head import REFUSED, malformed, request_head, trailer_lines
from edge.core.h2proto import H2Server
from edge.core.h2wire import (
    CANCEL,
    ENHANCE_YOUR_CALM,
    NO_ERROR,
    PROTOCOL_ERROR,
    H2ConnectionError,
    Settings,
    take_within,
)
from edge.core.headreader import RequestHeadReader
from edge.exchange import Exchange, Shell

log = logging.getLogger("thaw.edge.h2")

LINGER_S = 1.0  # an answered stream waits this long for the rest of its request
# streams one connection may open per turn of the event loop (Envoy's
# max_requests_per_io_cycle): a read holding more is taken in slices, the connection's
# reading paused meanwhile, so one client's hundred-stream bursts do not keep everyone
# else's requests waiting behind them
REQUESTS_PER_TURN = 8
CONNECTION_WINDOW = 16 << 20  # the connection's receive window (each stream's is smaller)


class H2Connection(StreamOwner):
    """An asyncio protocol by its methods, for one HTTP/2 client connection."""

    def __init__(self, shell: Shell, scheme: bytes = b"http", peer: bytes = b"unknown",
                 counted: bool = False) -> None:
        """`counted`: its arrival was counted against its client already (by the TLS
        door before the handshake, or as the HTTP/1 connection it began as: h2c)."""
        self.shell = shell
        self.config = config = shell.config
        self.loop = shell.loop
        self.scheme = scheme
        self.peer = peer
        self.share: ClientState | None = None  # its client's (Shell.connection_opened)
        self.trusted = shell.trust.trusts(peer)
        self.counted = counted
        self.hsts = shell.hsts if scheme == b"https" else b""
        self.transport: asyncio.Transport | None = None
        self.h2 = H2Server(self, Settings(
            max_concurrent_streams=config.h2_max_concurrent_streams,
            stream_window=config.h2_stream_window_bytes, connection_window=CONNECTION_WINDOW,
            max_header_list=config.max_header_bytes, header_table=config.h2_header_table_bytes,
            connect_protocol=config.h2_websockets,
        ), FrameBudget(Limits(
            resets_per_s=config.h2_resets_per_s, settings_per_s=config.h2_control_frames_per_s,
            pings_per_s=config.h2_control_frames_per_s,
            continuations_per_block=config.h2_max_continuations,
            header_block_bytes=config.max_header_bytes,
        ), self.loop.time()))
        self.reader = RequestHeadReader(config.max_headers, config.max_header_bytes,
                                        underscore_headers=config.underscore_headers)
        self.streams: dict[int, H2Stream] = {}
        # requests opened in this read, and whether their head ended them: dispatched when
        # the read is taken whole, so that a stream the client reset in the same read
        # (rapid reset), or made the edge reset (MadeYouReset: DATA past its length, a
        # bad window, ...), never reaches a machine nor counts as demand (Envoy defers
        # the same way); a body in the same read is buffered meanwhile
        self.arrived: list[tuple[H2Stream, bool]] = []
        self.write_paused = False
        self.write_soon = False  # a send of h2's queued bytes is scheduled
        self.slicing = False  # a read is taken in slices (REQUESTS_PER_TURN): reading paused
        self.unread = b""  # read while the client's turn was spent: taken next turn
        self.closed = False
        self.going_away = False
        self.last_active = self.loop.time()
        self.watchdog: asyncio.TimerHandle | None = None
        self.watch_every_s = min(config.idle_timeout_s, config.response_timeout_s,
                                 config.tunnel_idle_timeout_s) / 4

    # -- transport events ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=self.config.write_buffer_high_bytes)
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = str(peer[0]).encode()
            self.trusted = self.shell.trust.trusts(self.peer)
        refused = self.shell.connection_opened(self, new=not self.counted)
        self.h2.start()
        if refused is not None:  # the client is over its limits: GOAWAY to it alone
            self._close_with(ENHANCE_YOUR_CALM, refused)
            return
        self._write_out()
        self.watchdog = self.loop.call_later(self.watch_every_s, self._watch)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.shell.connection_closed(self)
        if self.watchdog is not None:
            self.watchdog.cancel()
            self.watchdog = None
        for stream in list(self.streams.values()):
            if stream.exchange is not None:
                stream.exchange.abort()
        self.streams.clear()

    def eof_received(self) -> bool:
        return False

    def pause_writing(self) -> None:
        self.write_paused = True
        for stream in list(self.streams.values()):
            stream.set_blocked(stream.blocked)

    def resume_writing(self) -> None:
        self.write_paused = False
        for stream in list(self.streams.values()):
            stream.set_blocked(stream.blocked)

    def data_received(self, data: bytes) -> None:
        if not self.closed:
            self._take(data)

    def _take(self, data: bytes) -> None:
        """Handle the client's bytes, REQUESTS_PER_TURN streams at most, and no more than
        its client has left of its share of this turn over all its connections
        (Shell.turn_left): with more, the rest waits for the loop's next turn (reading
        paused until it is all taken), and
        only the streams of earlier slices are dispatched now, those of this one after
        the next slice is read (a reset right after them in the read still cancels them
        first: rapid reset's pairs never reach a machine, sliced or not)."""
        left = self.shell.turn_left(self)  # the client's share of this turn
        if left <= 0:
            self.shell.turn_take(self)  # refused (none left): counted as put off
            self.unread += data
            self._slice()
            return
        mark = len(self.arrived)
        try:
            more = self.h2.receive(self.unread + data if self.unread else data,
                                   self.loop.time(), min(REQUESTS_PER_TURN, left))
            self.unread = b""
        except H2ConnectionError as exc:
            if exc.code == ENHANCE_YOUR_CALM:
                log.warning("HTTP/2 client %s over budget (%s): GOAWAY",
                            self.peer.decode("latin-1"), exc.reason)
                self.shell.client_struck(self)
            else:
                log.debug("HTTP/2 protocol error from %s: %s", self.peer.decode("latin-1"),
                          exc.reason)
            self._close_with(exc.code, exc.reason)
            return
        if self.h2.opened:
            self.shell.turn_take(self, self.h2.opened)
        if more:
            self._slice()
            if mark:
                self._dispatch_arrived(mark)
        else:
            if self.slicing:
                self.slicing = False
                if self.transport is not None and not self.closed:
                    self.transport.resume_reading()
            if self.arrived:
                self._dispatch_arrived(len(self.arrived))
        self._write_out()

    def _slice(self) -> None:
        """The rest of what was read waits for the loop's next turn, reading paused."""
        if not self.slicing:
            self.slicing = True
            if self.transport is not None:
                self.transport.pause_reading()
        self.loop.call_soon(self._take_more)

    def _take_more(self) -> None:
        if not self.closed:
            self._take(b"")

    def _dispatch_arrived(self, count: int) -> None:
        arrived, self.arrived = self.arrived[:count], self.arrived[count:]
        for stream, ended in arrived:
            exchange = stream.exchange
            if exchange is not None and not exchange.ended and \
                    self.streams.get(stream.stream_id) is stream:
                self.shell.dispatch(exchange)
                if ended:
                    exchange.end_body()

    # -- the protocol's events -------------------------------------------------------------

    def on_request(self, stream_id: int, headers: list[tuple[bytes, bytes]], ended: bool,
                   too_large: bool) -> None:
        if self.closed:
            return
        if too_large:
            stream = H2Stream(self, stream_id)
            self.streams[stream_id] = stream
            stream.send_error(None, "headers_too_large")
            return
        self._request(stream_id, headers, ended)

    def on_data(self, stream_id: int, data: bytes, flow_length: int) -> None:
        self._body(stream_id, data, flow_length)

    def on_trailers(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if any(name[:1] == b":" for name, _ in headers):
            self._malformed(stream)  # pseudo-headers in trailers (RFC 9113 8.1)
            return
        stream.request_trailers = trailer_lines(headers)

    def on_end(self, stream_id: int) -> None:
        self._body_end(stream_id)

    def on_reset(self, stream_id: int, code: int) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None:
            self.drop(stream)  # cancels its exchange upstream too
        if not self.shell.client_reset(self):
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "too many stream resets from this client")

    def on_window(self, stream_id: int) -> None:
        if stream_id:
            stream = self.streams.get(stream_id)
            if stream is not None:
                self.flush(stream, write=False)
        else:
            for stream in list(self.streams.values()):
                self.flush(stream, write=False)

    def on_goaway(self, last_stream_id: int, code: int) -> None:
        self.going_away = True
        if not self.streams:
            self._close_transport()

    # -- requests ------------------------------------------------------------------------

    def _request(self, stream_id: int, headers: list[tuple[bytes, bytes]],
                 ended: bool) -> None:
        stream = H2Stream(self, stream_id)
        self.streams[stream_id] = stream
        self.last_active = self.loop.time()
        why = malformed(headers)
        if why is not None:
            log.debug("malformed HTTP/2 request from %s: %s", self.peer.decode("latin-1"), why)
            self._malformed(stream)
            return
        if self.going_away or self.shell.closing:
            stream.send_error(None, "shutting_down")
            return
        decided = request_head(self.reader, headers, ended, self.config.max_body_bytes,
                               _websocket_key(headers) if self.config.h2_websockets else b"")
        if decided == REFUSED:
            self._malformed(stream)
            return
        if isinstance(decided, str):
            stream.send_error(None, decided)
            return
        method, head, websocket = decided
        exchange = Exchange(self.shell, stream, method, head, True, False)
        stream.exchange = exchange
        if websocket:  # RFC 8441: the stream is the tunnel once the machine answers 101
            exchange.upgrade = stream.tunnel = True
            self.shell.dispatch(exchange)
            exchange.end_body()  # (no body: the stream's DATA is the tunnel's)
            return
        self.arrived.append((stream, ended))  # dispatched at the end of the read

    def _body(self, stream_id: int, data: bytes, flow_length: int) -> None:
        stream = self.streams.get(stream_id)
        exchange = stream.exchange if stream is not None else None
        if stream is not None and stream.lingering is not None:
            self._credit(stream_id, flow_length)  # answered: read, checked, dropped
            stream.received += len(data)
            if 0 <= stream.declared < stream.received:
                self._malformed(stream)
            return
        if stream is None or exchange is None or exchange.ended:
            self._credit(stream_id, flow_length)  # nobody wants it: keep the window open
            return
        if stream.tunnel:
            stream.tunnel_in(exchange, data, flow_length)
            return
        if exchange.received + len(data) > self.config.max_body_bytes:
            self._credit(stream_id, flow_length)
            self.shell.fail(exchange, "body_too_large",
                            f"body over {self.config.max_body_bytes} bytes")
            return
        head = exchange.head
        if head.body == BODY_LENGTH and exchange.received + len(data) > head.content_length:
            self._credit(stream_id, flow_length)
            self._malformed(stream)  # more than it declared
            return
        exchange.feed_body(data)
        if stream.pause_reasons:
            stream.unacked += flow_length  # the client's window closes until it went on
        else:
            self.h2.ack_data(stream_id, flow_length)

    def _body_end(self, stream_id: int) -> None:
        stream = self.streams.get(stream_id)
        exchange = stream.exchange if stream is not None else None
        if stream is None:
            return
        stream.remote_ended = True
        if stream.lingering is not None:  # the rest of an answered request came
            if 0 <= stream.declared != stream.received:
                self._malformed(stream)
            else:
                self.drop(stream)
            return
        if exchange is None:
            return
        if stream.tunnel:  # the client closed its side: so does the machine's
            if exchange.phase == Phase.TUNNEL:
                exchange.close_tunnel()
            else:
                self.reset(stream, CANCEL)  # before the machine even answered
            return
        head = exchange.head
        if head.body == BODY_LENGTH and exchange.received != head.content_length:
            self._malformed(stream)  # less than it declared
            return
        exchange.end_body(stream.request_trailers)

    def _malformed(self, stream: H2Stream) -> None:
        """A stream error of the client's making: RST_STREAM PROTOCOL_ERROR, counted
        against the reset budget (which raises H2ConnectionError past it)."""
        self.drop(stream)
        if not self.shell.client_reset(self):
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "too many stream errors from this client")
        self.h2.stream_error(stream.stream_id, PROTOCOL_ERROR)

    def _credit(self, stream_id: int, size: int) -> None:
        """Give back `size` bytes of window (the connection's, and the stream's if open)."""
        self.h2.ack_data(stream_id, size)

    def drop(self, stream: H2Stream) -> None:
        """Forget `stream` (reset, or closed under us): its exchange is cancelled (upstream
        too) and the window its unread bytes held is given back."""
        if self.streams.pop(stream.stream_id, None) is None:
            return
        if stream.lingering is not None:
            stream.lingering.cancel()
            stream.lingering = None
        unacked, stream.unacked = stream.unacked, 0
        self._credit(stream.stream_id, unacked)
        stream.out.clear()
        stream.out_bytes = 0
        exchange = stream.exchange
        if exchange is not None and not exchange.ended:
            self.loop.call_soon(exchange.abort)  # not from inside the machine's callbacks

    # -- sending -------------------------------------------------------------------------

    def send_headers(self, stream: H2Stream, headers: list[tuple[bytes, bytes]]) -> None:
        if self.closed or stream.stream_id not in self.streams:
            return
        if not self.h2.send_headers(stream.stream_id, headers):
            self.drop(stream)
            return
        self._write_out()

    def flush(self, stream: H2Stream, write: bool = True) -> None:
        """Send what the client's window allows; END_STREAM once all is sent."""
        sid = stream.stream_id
        if self.closed or sid not in self.streams:
            return
        h2 = self.h2
        while stream.out:
            window = h2.window(sid)
            if window <= 0:
                break
            chunk = take_within(stream.out, window)
            stream.out_bytes -= len(chunk)
            stream.sent_at = self.loop.time()
            last = stream.ending and not stream.out and not stream.trailers
            h2.send_data(sid, chunk, end_stream=last)  # (the last DATA carries END_STREAM)
            if last:
                stream.ending = False
                self.stream_settled(stream)
        if stream.ending and not stream.out:
            stream.ending = False
            sent = (h2.send_headers(sid, stream.trailers, end_stream=True) if stream.trailers
                    else h2.send_data(sid, b"", end_stream=True))
            if not sent:
                self.drop(stream)
                return
            self.stream_settled(stream)
        stream.set_blocked(stream.out_bytes > self.config.h2_stream_buffer_bytes)
        if write:
            self._write_out()

    def acknowledge(self, stream: H2Stream, size: int) -> None:
        if not self.closed and stream.stream_id in self.streams:
            self.h2.ack_data(stream.stream_id, size)
            self._write_out()

    def reset(self, stream: H2Stream, code: int, after_end: bool = False) -> None:
        sid = stream.stream_id
        if self.closed or sid not in self.streams:
            return
        if after_end and (stream.out or stream.ending):
            return  # the answer is still going out: stream_settled resets it after
        self.drop(stream)
        self.h2.reset_stream(sid, code)
        self._write_out()

    def stream_settled(self, stream: H2Stream) -> None:
        """Forget a stream whose answer went out whole and whose exchange ended."""
        if stream.exchange is None and not stream.out and not stream.ending:
            if stream.body_open and not stream.remote_ended:  # answered before the client
                stream.body_open = False                         # sent all: linger
                stream.lingering = self.loop.call_later(LINGER_S, self._linger_end, stream)
                return
            self.drop(stream)
            self._stream_gone()

    def _linger_end(self, stream: H2Stream) -> None:
        """An answered stream's client did not end its request in time: stop it."""
        stream.lingering = None
        self.reset(stream, NO_ERROR)
        self._stream_gone()

    def _stream_gone(self) -> None:
        """A stream was forgotten: the connection's idle time starts again, and a
        connection going away closes with its last stream."""
        self.last_active = self.loop.time()
        if self.going_away and not self.streams:
            self._close_transport()

    def _write_out(self) -> None:
        """Send what h2 has queued, once per turn of the loop: every frame made while
        handling one read (of the client's or of any machine's) goes out in one send."""
        if not self.write_soon:
            self.write_soon = True
            self.loop.call_soon(self._send_now)

    def _send_now(self) -> None:
        self.write_soon = False
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.closed:
            self.transport.write(data)

    # -- endings -------------------------------------------------------------------------

    def _close_with(self, code: int, reason: str) -> None:
        self.h2.goaway(code, reason.encode()[:100])  # (sent by _close_transport, before the close)
        for stream in list(self.streams.values()):
            if stream.exchange is not None:
                stream.exchange.abort()
        self.streams.clear()
        self.arrived.clear()
        self._close_transport()

    def _close_transport(self) -> None:
        """Close after what is queued: the last answers before a GOAWAY go out whole."""
        if self.closed:
            return
        self.closed = True
        data = self.h2.data_to_send()
        if self.transport is not None:
            if data:
                self.transport.write(data)
            self.transport.close()

    def close_if_idle(self) -> bool:
        if not self.streams:
            self._close_with(NO_ERROR, "")
            return True
        if not self.going_away:
            self.going_away = True
            self.h2.goaway(NO_ERROR, last_stream_id=max(self.streams))
            self._write_out()
        return False

    def abort_transport(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _watch(self) -> None:
        """Idle close, and the response timeout of each stream."""
        self.watchdog = None
        if self.closed:
            return
        now = self.loop.time()
        if not self.streams and now - self.last_active >= self.config.idle_timeout_s:
            self._close_with(NO_ERROR, "idle")
            return
        for stream in list(self.streams.values()):
            exchange = stream.exchange
            if exchange is None and stream.out \
                    and now - stream.sent_at >= self.config.response_timeout_s:
                self.reset(stream, CANCEL)  # a reader that stopped
                continue
            if (exchange is not None and Phase.FORWARDING <= exchange.phase <= Phase.RESPONDING
                    and now - exchange.progress_at >= self.config.response_timeout_s):
                self.shell.fail(exchange, "upstream_timeout",
                                f"the machine sent nothing for {now - exchange.progress_at:.1f}s")
            elif (exchange is not None and exchange.phase == Phase.TUNNEL
                    and now - exchange.progress_at >= self.config.tunnel_idle_timeout_s):
                exchange.close_tunnel()  # idle both ways
        self.watchdog = self.loop.call_later(self.watch_every_s, self._watch)


def _websocket_key(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A fresh Sec-WebSocket-Key (RFC 6455 4.1) for an RFC 8441 CONNECT, else b"" (no
    randomness spent on other requests)."""
    for name, value in headers:
        if name == b":protocol":
            return base64.b64encode(os.urandom(16)) if value == b"websocket" else b""
        if name[:1] != b":":
            break
    return b""
