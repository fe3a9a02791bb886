"""One call to an h2c machine: a stream of edge/adapters/h2upstream.py's connection, and
its exchange's `Upstream` — the request going out as the machine's windows allow, the
answer checked and passed on (edge/core/h2map.py), DATA acknowledged as the client
takes it, the body kept until the first answer frame so a stream the machine never
processed can go to the next machine whole.

The connection is reached through `Carrier` (h2upstream.py's H2UpstreamConnection
fills it in: a base class, as edge/exchange.py's ports, so the import goes one way).
"""

from __future__ import annotations

from collections import deque

from edge.core.framing import BODY_LENGTH, BODY_NONE
from edge.core.h2client import H2Client
from edge.core.h2map import request_fields, response_head, response_malformed
from edge.core.h2wire import Events
from edge.exchange import Exchange, Shell, Upstream


class Carrier(Events):
    """What a call asks of its connection (and the client core's events it takes)."""

    shell: Shell
    h2: H2Client
    streams: dict[int, H2UpstreamStream]
    keep_limit: int  # body bytes a stream keeps for a resend (the edge's body buffer)

    def push(self, stream: H2UpstreamStream) -> None:
        raise NotImplementedError

    def acknowledge(self, stream: H2UpstreamStream, size: int) -> None:
        raise NotImplementedError

    def cancel(self, stream: H2UpstreamStream) -> None:
        raise NotImplementedError

    def malformed(self, stream: H2UpstreamStream, why: str) -> None:
        raise NotImplementedError


class H2UpstreamStream(Upstream):
    """One request to an h2c machine: its exchange's `Upstream`."""

    def __init__(self, conn: Carrier, exchange: Exchange) -> None:
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
            conn.shell.fail(exchange, "bad_gateway", "no HTTP/2 stream could be opened")
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
        resend = unprocessed and kept is not None
        if kept is not None and resend:
            exchange.unsend(kept)
        self.conn.shell.upstream_lost(exchange, got_bytes, reused, resend)
