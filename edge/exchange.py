"""One request/response exchange between a client connection and a machine.

The client connection feeds the request body in, the upstream connection feeds
the response out; the Edge decides where it goes (forward, hold, fail). Bodies
are never buffered whole: while no upstream is attached the request body is
kept up to `body_buffer_bytes` and the client's reading is paused beyond that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge.core.framing import (
    BODY_CHUNKED,
    BODY_LENGTH,
    BODY_NONE,
    RequestHead,
    ResponseHead,
    status_line,
)
from edge.errors import error_response, status_of

if TYPE_CHECKING:
    from edge.client import ClientConnection
    from edge.upstream import UpstreamConnection
    from edge.view import AppEntry, MachineSlot

NEW, HELD, CONNECTING, FORWARDING, DONE = range(5)
IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})
PAUSE_PIPELINE, PAUSE_BUFFER, PAUSE_UPSTREAM = 1, 2, 4  # why a client's reading is paused
CHUNK_END = b"0\r\n\r\n"
CRLF = b"\r\n"


class Exchange:
    __slots__ = (
        "app", "attempts", "body_done", "buffered", "chunks", "client", "close_after", "error",
        "head", "held_at", "http10", "method", "pending_head", "progress_at", "received",
        "rechunk",
        "request_id", "response_started", "sent_all", "slot", "state", "status", "timing",
        "upstream", "upstream_head",
    )

    def __init__(self, client: ClientConnection, method: bytes, head: RequestHead,
                 keep_alive: bool, http10: bool) -> None:
        self.client = client
        self.method = method
        self.head = head
        self.http10 = http10
        self.close_after = not keep_alive
        self.app: AppEntry | None = None
        self.slot: MachineSlot | None = None
        self.upstream: UpstreamConnection | None = None
        self.state = NEW
        self.body_done = head.body == BODY_NONE
        self.sent_all = False
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.received = 0
        self.response_started = False
        self.rechunk = False
        self.attempts = 0
        self.held_at = 0.0
        self.timing = b""
        self.status = 0
        self.error: tuple[str, str] | None = None
        self.request_id = b""
        self.upstream_head = b""
        self.pending_head = b""  # response head not yet written: it goes out with the body
        self.progress_at = 0.0  # loop time bytes last moved while forwarding (response timeout)

    @property
    def retryable(self) -> bool:
        """May be sent again after delivery (idempotent, no body, nothing answered yet)."""
        return (self.method in IDEMPOTENT and self.head.body == BODY_NONE
                and not self.response_started)

    # -- request body, from the client parser --------------------------------------------

    def feed_body(self, data: bytes) -> None:
        self.received += len(data)
        upstream = self.upstream
        if upstream is not None and self.state == FORWARDING:
            self.progress_at = self.client.loop.time()
            if self.head.body == BODY_CHUNKED:
                upstream.writelines([b"%x\r\n" % len(data), data, CRLF])
            else:
                upstream.write(data)
        elif self.state != DONE:
            self.chunks.append(data)
            self.buffered += len(data)
            if self.buffered > self.client.edge.config.body_buffer_bytes:
                self.client.pause(PAUSE_BUFFER)

    def end_body(self) -> None:
        self.body_done = True
        upstream = self.upstream
        if upstream is not None and self.state == FORWARDING:
            if self.head.body == BODY_CHUNKED:
                upstream.write(CHUNK_END)
            self.sent_all = True

    def attach(self, upstream: UpstreamConnection) -> None:
        """An upstream connection is ready: send the head and whatever body is buffered."""
        self.upstream = upstream
        self.state = FORWARDING
        client = self.client
        self.progress_at = client.loop.time()
        self.sent_all = self.body_done
        if self.head.body == BODY_CHUNKED:
            parts = [self.upstream_head]
            for chunk in self.chunks:
                parts += (b"%x\r\n" % len(chunk), chunk, CRLF)
            if self.body_done:
                parts.append(CHUNK_END)
            upstream.writelines(parts)
        elif self.chunks:
            upstream.writelines([self.upstream_head, *self.chunks])
        else:
            upstream.write(self.upstream_head)  # a request without a body, or not yet read
        if self.buffered:
            self.chunks = []
            self.buffered = 0
            client.unpause(PAUSE_BUFFER)
        if client.write_paused:
            upstream.pause_reading()

    # -- response, from the upstream parser ----------------------------------------------

    def response_head(self, status: int, head: ResponseHead) -> None:
        body = head.body
        if body == BODY_LENGTH:
            framing = b"Content-Length: %d\r\n" % head.content_length
        elif body == BODY_NONE:
            framing = b""
        elif self.http10:  # chunked or until-close, to a client that cannot take chunks
            framing = b""
            self.close_after = True
        else:
            framing = b"Transfer-Encoding: chunked\r\n"
            self.rechunk = True
        if not self.body_done:
            self.close_after = True
        if self.close_after:
            connection = b"Connection: close\r\n"
        else:
            connection = b"Connection: keep-alive\r\n" if self.http10 else b""
        timing = b"Server-Timing: %s\r\n" % self.timing if self.timing else b""
        data = b"".join((status_line(status), head.forward, framing, connection, timing, CRLF))
        self.status = status
        self.response_started = True
        self.progress_at = self.client.loop.time()
        if body == BODY_LENGTH:
            self.pending_head = data  # goes out with the body: one send
        else:
            self.client.write(data)  # streams (SSE, long polls) see headers now

    def response_body(self, data: bytes) -> None:
        self.progress_at = self.client.loop.time()
        head, self.pending_head = self.pending_head, b""
        if self.rechunk:
            self.client.writelines([b"%x\r\n" % len(data), data, CRLF])
        elif not head:
            self.client.write(data)
        elif len(data) < 16384:
            self.client.write(head + data)  # one send for small answers
        else:
            self.client.writelines([head, data])

    def response_end(self) -> None:
        head, self.pending_head = self.pending_head, b""
        if self.rechunk:
            self.client.write(head + CHUNK_END)
        elif head:
            self.client.write(head)
        self.upstream = None
        self.finish()

    # -- endings -------------------------------------------------------------------------

    def fail(self, code: str, message: str) -> None:
        """End with an edge answer (or a cut connection once response bytes went out)."""
        if self.state == DONE:
            return
        upstream = self.upstream
        self.upstream = None
        if upstream is not None:
            upstream.abandon()
        if self.response_started:
            self.close_after = True
            self.client.abort_transport()
        else:
            if not self.body_done:
                self.close_after = True
            edge = self.client.edge
            self.status = status_of(code)
            self.client.write(error_response(
                code, message, keep_alive=not self.close_after,
                retry_after_s=edge.config.wake_retry_after_s,
                head_request=self.method == b"HEAD",
            ))
        self.finish()

    def finish(self) -> None:
        if self.state == DONE:
            return
        self.state = DONE
        client = self.client
        # The machine's backpressure no longer applies once this exchange is over
        # (fail() may have abandoned the upstream before it could unpause the client).
        if client.pause_reasons & PAUSE_UPSTREAM:
            client.unpause(PAUSE_UPSTREAM)
        client.edge.exchange_ended(self, True)
        client.exchange_done(self)

    def abort(self) -> None:
        """The client went away: stop everything this exchange holds."""
        if self.state == DONE:
            return
        upstream = self.upstream
        self.upstream = None
        if upstream is not None:
            upstream.abandon()
        self.client.edge.exchange_ended(self, False)
        self.state = DONE
