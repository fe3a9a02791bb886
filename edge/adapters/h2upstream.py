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

Each call on a connection is edge/adapters/h2call.py's stream; the pool of these
connections is edge/adapters/h2pool.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

from edge.adapters.h2call import Carrier, H2UpstreamStream
from edge.core.h2budget import FrameBudget, Limits
from edge.core.h2client import H2Client
from edge.core.h2map import trailer_fields, trailer_lines
from edge.core.h2wire import (
    CANCEL,
    NO_ERROR,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    H2ConnectionError,
    Settings,
    take_within,
)
from edge.exchange import Exchange, Shell

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


class H2UpstreamConnection(Carrier):
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
