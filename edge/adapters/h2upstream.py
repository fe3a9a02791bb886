"""The machine side for apps whose protocol is "h2c": HTTP/2 with prior knowledge (RFC
9113 3.3), every request a stream, multiplexed over one connection per machine (another
only when the machine's SETTINGS_MAX_CONCURRENT_STREAMS are all in use). gRPC servers
(grpcio, tonic, grpc-go) speak nothing else.

The frames are the edge's own HTTP/2 core in its client role (edge/core/h2client.py,
compiled); this module carries them between the event loop, the exchanges and edge/
core/h2map.py's mapping (and checking) of heads.

Flow control, both ways, per stream:
- the request body goes out as the machine's windows allow; a stream with more than
  `write_buffer_high_bytes` waiting (or a connection whose socket buffer is full)
  pauses its client's reading (`Exchange.upstream_busy`);
- the response body is acknowledged (WINDOW_UPDATE) as it is passed on, except while
  the exchange's client is paused (`pause_reading`): the machine then stops at that
  stream's window, and the connection's other streams go on.
Trailers go through both ways. The client's reset (or a timeout) resets the machine's
stream with CANCEL. The machine's reset of a stream it never answered is a lost request
under the shell's rules: REFUSED_STREAM, and streams above a GOAWAY's last id, were
never processed, and go to a machine again whatever their method, body included (a
stream keeps what it sent until the first answer frame, up to the edge's body buffer);
after an answer began it is a cut. A GOAWAY lets the streams at or below its last id
finish (a graceful shutdown loses no call); the connection closes once they have. A
malformed answer (its fields, DATA before its head, DATA beyond its content-length)
resets that stream alone (PROTOCOL_ERROR) and ends its exchange in 502, or cuts it once
the answer began.

The pool of these connections is edge/adapters/h2pool.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import cast

from edge.core.framing import BODY_LENGTH, BODY_NONE
from edge.core.h2budget import FrameBudget, Limits
from edge.core.h2client import H2Client
from edge.core.h2map import (
    request_fields,
    response_head,
    response_malformed,
    trailer_fields,
    trailer_lines,
)
from edge.core.h2wire import (
    CANCEL,
    NO_ERROR,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    Events,
    H2ConnectionError,
    Settings,
    take_within,
)
from edge.exchange import Exchange, Shell, Upstream

log = logging.getLogger("thaw.edge")

STREAM_WINDOW = 1 << 18  # 256 KiB a stream may send before it is acknowledged
CONNECTION_WINDOW = 1 << 24  # 16 MiB for all of a connection's streams
MAX_HEADER_LIST = 1 << 16  # a response head's or trailers' decoded size
# what a machine may send: its resets are how it refuses streams at its concurrency, so
# their budget is a flood's, not a client's
MACHINE_LIMITS = Limits(resets_per_s=10_000.0, settings_per_s=100.0, pings_per_s=100.0)


class ConnectionOwner:
    """What a connection asks of its pool (edge/adapters/h2pool.py fills it in: a base
    class, as edge/exchange.py's ports, so the import goes one way)."""

    shell: Shell
    loop: asyncio.AbstractEventLoop
    write_buffer_high_bytes: int

    def forget(self, conn: H2UpstreamConnection) -> None:
        raise NotImplementedError


class H2UpstreamStream(Upstream):
    """One request to an h2c machine: its exchange's `Upstream`."""

    def __init__(self, conn: H2UpstreamConnection, exchange: Exchange) -> None:
        self.conn = conn
        self.exchange: Exchange | None = exchange
        self.stream_id = 0
        self.out: deque[bytes] = deque()  # request DATA waiting for the machine's window
        self.out_bytes = 0
        self.ending = False  # the request ends once `out` is sent
        self.end_trailers = b""
        self.busy = False  # its client's reading is paused for the bytes waiting here
        self.paused = False  # its client cannot take more: received DATA is not acknowledged
        self.unacked = 0
        self.answered = False  # the machine's response head came
        self.local_ended = False  # END_STREAM went to the machine
        self.got_bytes = False
        self.trailers = b""
        self.length = -1  # the answer's content-length (-1: none to check)
        # an answer that has no body (HEAD, 204, 304): DATA on it is acknowledged and
        # dropped, never passed on (an HTTP/1.1 client would read it as its next answer)
        self.bodiless = False
        # the body as sent, until the machine's first answer frame: a stream it refuses
        # (or leaves above its GOAWAY) goes to the next with it; None once over the
        # edge's body buffer or answered
        self.kept: list[bytes] | None = []
        self.kept_bytes = 0

    # -- driven by the exchange ----------------------------------------------------------

    def send_request(self, exchange: Exchange) -> None:
        conn = self.conn
        ends = exchange.body_done and not exchange.chunks and not exchange.trailers
        if exchange.head.body == BODY_NONE:
            ends = True
        self.stream_id = conn.h2.open_stream(request_fields(exchange.upstream_head), ends)
        if not self.stream_id:  # (the pool hands out connections with room: not expected)
            self.exchange = None
            conn.shell.upstream_lost(exchange, False, True)
            return
        conn.streams[self.stream_id] = self
        self.local_ended = ends
        if not ends:
            for chunk in exchange.chunks:
                self._queue(chunk)
            self.ending = exchange.body_done
            self.end_trailers = exchange.trailers
        conn.push(self)

    def _queue(self, chunk: bytes) -> None:
        self.out.append(chunk)
        self.out_bytes += len(chunk)
        kept = self.kept
        if kept is not None:
            self.kept_bytes += len(chunk)
            if self.kept_bytes > self.conn.keep_limit:
                self.kept = None
            else:
                kept.append(chunk)

    def send_data(self, exchange: Exchange, data: bytes) -> None:
        if self.stream_id in self.conn.streams and not self.ending:
            self._queue(data)
            self.conn.push(self)

    def send_end(self, exchange: Exchange, trailers: bytes) -> None:
        if self.stream_id in self.conn.streams and not self.ending:
            self.ending = True
            self.end_trailers = trailers
            self.conn.push(self)

    def write(self, data: bytes) -> None:
        """No tunnels over HTTP/2 to a machine (the shell refuses upgrades to h2c apps)."""

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False
        if self.unacked:
            unacked, self.unacked = self.unacked, 0
            self.conn.acknowledge(self, unacked)

    def abandon(self) -> None:
        """The exchange is over without this answer: the machine stops working on it."""
        self.exchange = None
        self.conn.cancel(self)

    # -- the machine's answer ------------------------------------------------------------

    def on_head(self, fields: list[tuple[bytes, bytes]], ended: bool) -> None:
        exchange = self.exchange
        self.kept = None  # answered: processed
        if exchange is None:
            return
        why = response_malformed(fields)
        if why is not None:
            self.conn.malformed(self, why)
            return
        status, head, trailers = response_head(fields, ended, exchange.method == b"HEAD")
        if not 200 <= status <= 599:
            self.conn.malformed(self, f"a response with status {status}")
            return
        self.answered = True
        self.got_bytes = True
        self.trailers = trailers
        if head.body == BODY_LENGTH:
            self.length = head.content_length
        elif head.body == BODY_NONE:
            self.bodiless = True  # HEAD, 204, 304: whatever DATA follows is dropped
        exchange.response_head(status, head)

    def on_data(self, data: bytes, flow_length: int) -> None:
        exchange = self.exchange
        self.got_bytes = True
        self.kept = None
        if exchange is not None and data and not self.bodiless:
            why = "" if self.answered else "DATA before the response's head"
            if self.length >= 0 and not why:
                self.length -= len(data)
                if self.length < 0:
                    why = "DATA beyond the response's content-length"
            if why:
                self.conn.malformed(self, why)
                self.conn.acknowledge(self, flow_length)  # (the connection's share)
                return
            exchange.response_body(data)
        if self.paused and exchange is not None:
            self.unacked += flow_length
        elif flow_length:
            self.conn.acknowledge(self, flow_length)

    def release_window(self) -> None:
        """DATA held back while its client was paused is acknowledged when the stream
        ends any way (else the connection's window leaks until every stream crawls)."""
        self.paused = False
        if self.unacked:
            unacked, self.unacked = self.unacked, 0
            self.conn.acknowledge(self, unacked)

    def on_end(self) -> None:
        self.release_window()
        exchange = self.exchange
        if exchange is None:
            return
        if not self.answered:
            self.conn.malformed(self, "a stream ended without a response")
            return
        if self.length > 0:
            self.conn.malformed(self, "a body shorter than its content-length")
            return
        self.exchange = None
        if self.busy:
            self.busy = False
            exchange.upstream_busy(False)
        exchange.response_end(self.trailers)

    def lost(self, got_bytes: bool, reused: bool, unprocessed: bool = False) -> None:
        """The stream is gone without its answer's end (the shell's `upstream_lost` rules).
        `unprocessed`: the machine said it never acted on it (REFUSED_STREAM, above its
        GOAWAY's last id, or nothing went out): with its body kept, it may go again
        whatever its method."""
        self.release_window()
        exchange = self.exchange
        self.exchange = None
        if exchange is None:
            return
        if self.busy:
            exchange.upstream_busy(False)
        kept = self.kept
        if unprocessed and kept is not None:
            exchange.unsend(kept)
            self.conn.shell.upstream_lost(exchange, got_bytes, reused, True)
        else:
            self.conn.shell.upstream_lost(exchange, got_bytes, reused)


class H2UpstreamConnection(Events):
    """One HTTP/2 connection to a machine (an asyncio protocol by its methods, and the
    events of its client core)."""

    def __init__(self, pool: ConnectionOwner, address: str) -> None:
        self.pool = pool
        self.shell = pool.shell
        self.address = address
        self.h2 = H2Client(self, Settings(
            max_concurrent_streams=0, stream_window=STREAM_WINDOW,
            connection_window=CONNECTION_WINDOW, max_header_list=MAX_HEADER_LIST,
        ), FrameBudget(MACHINE_LIMITS, pool.loop.time()))
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, H2UpstreamStream] = {}
        self.closed = False
        self.going_away = False  # the machine sent GOAWAY (or the pool closes it): no new streams
        self.write_paused = False
        self.idle_since = pool.loop.time()
        self.used = 0
        self.keep_limit = pool.shell.config.body_buffer_bytes  # (H2UpstreamStream.kept)

    @property
    def usable(self) -> bool:
        return (not self.closed and not self.going_away and self.transport is not None
                and self.h2.can_open)

    def send(self, exchange: Exchange) -> None:
        """Open a stream for `exchange` (its head and what body it has go out now)."""
        self.used += 1
        stream = H2UpstreamStream(self, exchange)
        exchange.attach(stream)
        if self.closed:  # closed while the request waited for it: nothing went out
            self.streams.pop(stream.stream_id, None)
            stream.lost(False, True, True)
            return
        self.flush()

    # -- what streams ask ------------------------------------------------------------------

    def push(self, stream: H2UpstreamStream) -> None:
        """Send what the stream has waiting, as far as the windows allow."""
        h2conn = self.h2
        sid = stream.stream_id
        if not h2conn.is_open(sid):  # the machine reset or ended it meanwhile
            stream.out.clear()
            stream.out_bytes = 0
            stream.ending = False
        while stream.out:
            window = h2conn.window(sid)
            if window <= 0:
                break
            chunk = take_within(stream.out, window)
            stream.out_bytes -= len(chunk)
            h2conn.send_data(sid, chunk)
        if stream.ending and not stream.out:
            stream.ending = False  # sent: never twice
            stream.local_ended = True
            if stream.end_trailers:
                h2conn.send_headers(sid, trailer_fields(stream.end_trailers), end_stream=True)
            else:
                h2conn.send_data(sid, b"", end_stream=True)
        self._busy(stream)
        self.flush()

    def _busy(self, stream: H2UpstreamStream) -> None:
        busy = stream.out_bytes > self.pool.write_buffer_high_bytes or self.write_paused
        if busy != stream.busy and stream.exchange is not None:
            stream.busy = busy
            stream.exchange.upstream_busy(busy)

    def acknowledge(self, stream: H2UpstreamStream, size: int) -> None:
        self.h2.ack_data(stream.stream_id, size)
        self.flush()

    def cancel(self, stream: H2UpstreamStream) -> None:
        if self.streams.pop(stream.stream_id, None) is None:
            return
        stream.release_window()
        self._reset(stream, CANCEL)
        self._settled()
        self.flush()

    def _reset(self, stream: H2UpstreamStream, code: int) -> None:
        stream.out.clear()
        stream.out_bytes = 0
        stream.ending = False
        self.h2.reset_stream(stream.stream_id, code)  # (nothing, if it is over already)

    def malformed(self, stream: H2UpstreamStream, why: str) -> None:
        """The machine's answer on `stream` is malformed: that stream is reset, its
        exchange ends in 502 (or is cut, once its answer began); the connection stays."""
        self.streams.pop(stream.stream_id, None)
        stream.release_window()
        self._reset(stream, PROTOCOL_ERROR)
        exchange = stream.exchange
        stream.exchange = None
        if exchange is not None:
            if stream.busy:
                exchange.upstream_busy(False)
            self.shell.fail(exchange, "bad_gateway",
                            f"machine at {self.address} sent a malformed HTTP/2 answer: {why}")
        self._settled()
        self.flush()

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.closed:
            self.transport.write(data)

    def close(self) -> None:
        if self.closed:
            return
        if self.transport is not None:
            self.h2.goaway(NO_ERROR)
            self.flush()
            self.transport.close()
        self.closed = True

    def sever(self) -> None:
        """Cut now, streams too: the machine's host is lost."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _settled(self) -> None:
        if not self.streams:
            self.idle_since = self.pool.loop.time()
            if self.going_away:
                self.close()

    # -- transport events ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=self.pool.write_buffer_high_bytes)
        self.h2.start()
        self.flush()

    def data_received(self, data: bytes) -> None:
        try:
            self.h2.receive(data, self.pool.loop.time())
        except H2ConnectionError as exc:
            log.warning("machine at %s broke HTTP/2: %s", self.address, exc.reason)
            self.h2.goaway(exc.code, exc.reason.encode()[:200])
            self.flush()
            self.sever()
            return
        self.flush()

    def pause_writing(self) -> None:
        self.write_paused = True
        for stream in list(self.streams.values()):
            self._busy(stream)

    def resume_writing(self) -> None:
        self.write_paused = False
        for stream in list(self.streams.values()):
            self._busy(stream)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            stream.lost(stream.got_bytes, self.used > 1)

    # -- the client core's events ----------------------------------------------------------

    def on_response(self, stream_id: int, headers: list[tuple[bytes, bytes]],
                    ended: bool) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.on_head(headers, ended)

    def on_data(self, stream_id: int, data: bytes, flow_length: int) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.on_data(data, flow_length)
        elif flow_length:
            self.h2.ack_data(stream_id, flow_length)

    def on_trailers(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.trailers = trailer_lines(headers)

    def on_end(self, stream_id: int) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        stream.on_end()
        if self.streams.get(stream_id) is not stream:
            return  # (it was malformed: reset and settled already)
        del self.streams[stream_id]
        if not stream.local_ended:  # answered before the request was all sent
            self._reset(stream, CANCEL)
        self._settled()

    def on_reset(self, stream_id: int, code: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is not None:
            # REFUSED_STREAM: never processed (sent again, body and all), counted as an
            # attempt, not as a stale connection: it is how a machine says it is at its
            # concurrency, and its connection stays
            refused = code == REFUSED_STREAM
            stream.lost(not refused, False, refused)
            self._settled()

    def on_window(self, stream_id: int) -> None:
        if stream_id:
            stream = self.streams.get(stream_id)
            if stream is not None and (stream.out or stream.ending):
                self.push(stream)
            return
        for stream in list(self.streams.values()):
            if stream.out or stream.ending:
                self.push(stream)

    def on_goaway(self, last_stream_id: int, code: int) -> None:
        self.going_away = True
        for sid in [sid for sid in self.streams if sid > last_stream_id]:
            self.streams.pop(sid).lost(False, True, True)  # never processed
        self._settled()
