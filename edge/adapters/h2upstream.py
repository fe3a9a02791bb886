"""The machine side for apps whose protocol is "h2c": HTTP/2 with prior knowledge (RFC
9113 3.3), every request a stream, multiplexed over one connection per machine (another
only when the machine's SETTINGS_MAX_CONCURRENT_STREAMS are all in use). gRPC servers
(grpcio, tonic, grpc-go) speak nothing else.

The frames are the `h2` library's (a client's state machine); this module carries them
between the event loop, the exchanges and edge/core/h2map.py's mapping of heads.

Flow control, both ways, per stream:
- the request body goes out as the machine's windows allow; a stream with more than
  `write_buffer_high_bytes` waiting (or a connection whose socket buffer is full)
  pauses its client's reading (`Exchange.upstream_busy`);
- the response body is acknowledged (WINDOW_UPDATE) as it is passed on, except while
  the exchange's client is paused (`pause_reading`): the machine then stops at that
  stream's window, and the connection's other streams go on.
Trailers go through both ways. The client's reset (or a timeout) resets the machine's
stream with CANCEL; the machine's reset of a stream it never answered is a lost
request under the shell's rules (REFUSED_STREAM, and streams above a GOAWAY's last
id, were never processed: sent again if they may be — not a call with a body), after
an answer began a cut. (The h2 library ends its connection state at a GOAWAY, so the
streams below its last id are lost too: docs/edge.md, "gRPC apps".)

The pool of these connections is edge/adapters/h2pool.py; the HPACK coder in h2's
place, edge/adapters/h2fields.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import cast

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from edge.adapters.h2fields import FieldDecoder, FieldEncoder
from edge.core.framing import BODY_NONE
from edge.core.h2map import request_fields, response_head, trailer_fields, trailer_lines
from edge.core.h2wire import take_within
from edge.exchange import Exchange, Shell, Upstream

log = logging.getLogger("thaw.edge")

STREAM_WINDOW = 1 << 18  # 256 KiB a stream may send before it is acknowledged
CONNECTION_WINDOW = 1 << 24  # 16 MiB for all of a connection's streams
CANCEL = h2.errors.ErrorCodes.CANCEL
REFUSED_STREAM = h2.errors.ErrorCodes.REFUSED_STREAM


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

    # -- driven by the exchange ----------------------------------------------------------

    def send_request(self, exchange: Exchange) -> None:
        conn = self.conn
        ends = exchange.body_done and not exchange.chunks and not exchange.trailers
        if exchange.head.body == BODY_NONE:
            ends = True
        try:
            self.stream_id = conn.h2.get_next_available_stream_id()
            conn.h2.send_headers(self.stream_id, request_fields(exchange.upstream_head),
                                 end_stream=ends)
        except (h2.exceptions.ProtocolError, ValueError) as exc:
            conn.refused(self, f"the request cannot be sent over HTTP/2: {exc}")
            return
        conn.streams[self.stream_id] = self
        self.local_ended = ends
        if not ends:
            for chunk in exchange.chunks:
                self.out.append(chunk)
                self.out_bytes += len(chunk)
            self.ending = exchange.body_done
            self.end_trailers = exchange.trailers
        conn.push(self)

    def send_data(self, exchange: Exchange, data: bytes) -> None:
        if self.stream_id in self.conn.streams and not self.ending:
            self.out.append(data)
            self.out_bytes += len(data)
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
        if exchange is None:
            return
        status, head, trailers = response_head(fields, ended, exchange.method == b"HEAD")
        if not 200 <= status <= 599:
            self.exchange = None
            self.conn.cancel(self)
            self.conn.shell.fail(exchange, "bad_gateway",
                                 f"machine sent an HTTP/2 response with status {status}")
            return
        self.answered = True
        self.got_bytes = True
        self.trailers = trailers
        exchange.response_head(status, head)

    def on_data(self, data: bytes, flow_length: int) -> None:
        exchange = self.exchange
        self.got_bytes = True
        if exchange is not None and data:
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
        self.exchange = None
        if exchange is None:
            return
        if not self.answered:
            self.conn.shell.fail(exchange, "bad_gateway",
                                 "machine ended an HTTP/2 stream without a response")
            return
        if self.busy:
            self.busy = False
            exchange.upstream_busy(False)
        exchange.response_end(self.trailers)

    def lost(self, got_bytes: bool, reused: bool) -> None:
        """The stream is gone without its answer's end (the shell's `upstream_lost` rules:
        one the machine says it never acted on — REFUSED_STREAM, or above a GOAWAY's last
        id — has `got_bytes` False)."""
        self.release_window()
        exchange = self.exchange
        self.exchange = None
        if exchange is None:
            return
        if self.busy:
            exchange.upstream_busy(False)
        self.conn.shell.upstream_lost(exchange, got_bytes, reused)


class H2UpstreamConnection:
    """One HTTP/2 connection to a machine (an asyncio protocol by its methods)."""

    def __init__(self, pool: ConnectionOwner, address: str) -> None:
        self.pool = pool
        self.shell = pool.shell
        self.address = address
        # What the edge sends was checked by its own parsers (edge/core/h2map.py keeps
        # connection fields out): no second check nor normalisation on the way out. What
        # the machine sends is checked (inbound validation stays on).
        config = h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_outbound_headers=False,
            normalize_outbound_headers=False, split_outbound_cookies=False)
        self.h2 = h2.connection.H2Connection(config=config)
        self.h2.encoder = FieldEncoder()  # type: ignore[assignment]  # (duck-typed by h2)
        self.h2.decoder = FieldDecoder()  # type: ignore[assignment]
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, H2UpstreamStream] = {}
        self.closed = False
        self.going_away = False  # the machine sent GOAWAY: no new streams
        self.write_paused = False
        self.idle_since = pool.loop.time()
        self.used = 0

    @property
    def usable(self) -> bool:
        if self.closed or self.going_away or self.transport is None:
            return False
        if self.h2.highest_outbound_stream_id >= (1 << 31) - 2:
            return False
        # Its own count of streams, and h2's (which may still hold a stream this one let
        # go) only near the limit: h2's open_outbound_streams walks every stream.
        limit = self.h2.remote_settings.max_concurrent_streams
        count = len(self.streams)
        return count < limit and (count + 16 < limit or self.h2.open_outbound_streams < limit)

    def send(self, exchange: Exchange) -> None:
        """Open a stream for `exchange` (its head and what body it has go out now)."""
        self.used += 1
        stream = H2UpstreamStream(self, exchange)
        exchange.attach(stream)
        if self.closed:  # closed while the request waited for it: nothing went out
            self.streams.pop(stream.stream_id, None)
            stream.lost(False, True)
            return
        self.flush()

    # -- what streams ask ------------------------------------------------------------------

    def push(self, stream: H2UpstreamStream) -> None:
        """Send what the stream has waiting, as far as the windows allow."""
        h2conn = self.h2
        sid = stream.stream_id
        try:
            while stream.out:
                window = min(h2conn.local_flow_control_window(sid),
                             h2conn.max_outbound_frame_size)
                if window <= 0:
                    break
                chunk = take_within(stream.out, window)
                stream.out_bytes -= len(chunk)
                h2conn.send_data(sid, chunk)
            if stream.ending and not stream.out:
                stream.ending = False  # sent: never twice
                stream.local_ended = True
                if stream.end_trailers:
                    h2conn.send_headers(sid, trailer_fields(stream.end_trailers),
                                        end_stream=True)
                else:
                    h2conn.end_stream(sid)
        except h2.exceptions.StreamClosedError:  # the machine reset or ended it meanwhile
            stream.out.clear()
            stream.out_bytes = 0
        except h2.exceptions.ProtocolError as exc:
            self.refused(stream, f"the request cannot be sent over HTTP/2: {exc}")
            return
        self._busy(stream)
        self.flush()

    def _busy(self, stream: H2UpstreamStream) -> None:
        busy = stream.out_bytes > self.pool.write_buffer_high_bytes or self.write_paused
        if busy != stream.busy and stream.exchange is not None:
            stream.busy = busy
            stream.exchange.upstream_busy(busy)

    def acknowledge(self, stream: H2UpstreamStream, size: int) -> None:
        try:
            self.h2.acknowledge_received_data(size, stream.stream_id)
        except h2.exceptions.StreamClosedError:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.h2.increment_flow_control_window(size)  # the connection's share only
        except h2.exceptions.ProtocolError:  # the connection is closed (a GOAWAY came)
            return
        self.flush()

    def cancel(self, stream: H2UpstreamStream) -> None:
        if self.streams.pop(stream.stream_id, None) is None:
            return
        stream.release_window()
        self._reset(stream)
        self._settled()
        self.flush()

    def _reset(self, stream: H2UpstreamStream) -> None:
        stream.out.clear()
        stream.out_bytes = 0
        stream.ending = False
        # (StreamClosedError: it ended meanwhile; any other ProtocolError: the connection
        # is closed, after a GOAWAY — nothing to reset, and a client's cancel must not
        # raise out of its exchange's abort)
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.reset_stream(stream.stream_id, CANCEL)

    def refused(self, stream: H2UpstreamStream, detail: str) -> None:
        exchange = stream.exchange
        stream.exchange = None
        self.streams.pop(stream.stream_id, None)
        if exchange is not None:
            self.shell.fail(exchange, "bad_gateway", detail)

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.closed:
            self.transport.write(data)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.h2.close_connection()
                self.flush()
                self.transport.close()

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
        h2conn = self.h2
        h2conn.initiate_connection()
        h2conn.update_settings({h2.settings.SettingCodes.ENABLE_PUSH: 0,
                                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW})
        h2conn.increment_flow_control_window(CONNECTION_WINDOW - 65_535)
        self.flush()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            log.warning("machine at %s broke HTTP/2: %s", self.address, exc)
            self.flush()  # its GOAWAY
            self.sever()
            return
        for event in events:
            self._event(event)
        self.flush()

    def _event(self, event: h2.events.Event) -> None:  # noqa: C901 (one branch an event)
        if isinstance(event, h2.events.ResponseReceived):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.on_head(event.headers, event.stream_ended is not None)
        elif isinstance(event, h2.events.DataReceived):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.on_data(event.data, event.flow_controlled_length)
            elif event.flow_controlled_length:
                self.h2.acknowledge_received_data(event.flow_controlled_length,
                                                  event.stream_id)
        elif isinstance(event, h2.events.TrailersReceived):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.trailers = trailer_lines(event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self.streams.pop(event.stream_id, None)
            if stream is not None:
                stream.on_end()
                if not stream.local_ended:  # answered before the request was all sent
                    self._reset(stream)
                self._settled()
        elif isinstance(event, h2.events.StreamReset):
            stream = self.streams.pop(event.stream_id, None)
            if stream is not None:
                # REFUSED_STREAM: never processed (sent again if it may be), counted as
                # an attempt, not as a stale connection: it is how a machine says it is
                # at its concurrency, and its connection stays
                refused = event.error_code == REFUSED_STREAM
                stream.lost(not refused, False)
                self._settled()
        elif isinstance(event, h2.events.WindowUpdated):
            targets = (list(self.streams.values()) if event.stream_id == 0
                       else [s for s in (self.streams.get(event.stream_id),) if s is not None])
            for stream in targets:
                if stream.out or stream.ending:
                    self.push(stream)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.going_away = True
            last = event.last_stream_id if event.last_stream_id is not None else 0
            for sid in [sid for sid in self.streams if sid > last]:
                self.streams.pop(sid).lost(False, True)
            self._settled()

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
