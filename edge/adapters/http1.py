"""HTTP/1.x front door: an asyncio Protocol around httptools' request parser.

HTTP/1.1 keep-alive and pipelining (one exchange active per connection, the
next parsed and queued with reading paused, so answers go out in order),
HTTP/1.0, streamed bodies with backpressure both ways, a header-read deadline
and a keep-alive idle timeout. Any parse or framing error ends the connection
after a 400 (or 408/413/431/501/505) JSON answer. An upgrade to h2c alone (what
`curl --http2` sends to an http:// URL) is ignored: the request is served as
the HTTP/1.1 request it also is, and the connection goes on. It is the
`Downstream` of its exchanges: it frames their answers as HTTP/1.x. A
WebSocket upgrade is forwarded (held and woken like any request); after the
machine's 101 the connection is a tunnel to it, bytes both ways with
backpressure, until either side closes or it is idle `tunnel_idle_timeout_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from types import SimpleNamespace
from typing import cast

import httptools

from edge.adapters.http2 import H2Connection
from edge.core.clients import BARRED, ClientState
from edge.core.exchange import Phase, response_framing
from edge.core.framing import (
    BODY_CHUNKED,
    BODY_LENGTH,
    BODY_NONE,
    CRLF,
    Rejection,
    RequestHead,
    ResponseHead,
    last_chunk,
    sets_hsts,
    status_line,
)
from edge.core.h2wire import FRAME_HEAD, GOAWAY, PREFACE, PREFACE_LINE, PROTOCOL_ERROR, U32
from edge.core.headreader import RequestHeadReader
from edge.errors import error_response
from edge.exchange import (
    PAUSE_BUFFER,
    PAUSE_PIPELINE,
    PAUSE_TURN,
    Downstream,
    Exchange,
    Shell,
)

log = logging.getLogger("thaw.edge")

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def _placeholder_head() -> RequestHead:
    return RequestHead(host="", authority=b"", target=b"", body=BODY_NONE, content_length=0,
                       expect_continue=False, request_id=None, forwarded_for=None,
                       hold_timeout_s=None, forward=b"")


# the answer to a connection whose client is over its limits (made once: a flood of them
# costs no more than it must)
OVER_LIMITS = error_response("too_many_requests", keep_alive=False)
LINGER_NONE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets
# what a parked connection holds in place of its own parser and reader (never used: its
# next bytes make new ones first)
IDLE_READER = RequestHeadReader(1, 1)
IDLE_PARSER = httptools.HttpRequestParser(SimpleNamespace())


class _Stop(Exception):
    """Raised inside a parser callback to stop parsing; the reason is kept on the connection."""


def reset(transport: asyncio.Transport) -> None:
    """Close with a reset, at once and with nothing written (SO_LINGER 0, as HAProxy's
    `tcp-request connection reject` closes): no FIN exchange, no TIME_WAIT left here."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_NONE)
    transport.abort()


class ClientConnection(Downstream):
    """An asyncio protocol by its methods (uvloop needs no asyncio base class, so it can be
    a native class when compiled), and the `Downstream` of the exchanges it reads."""

    def __init__(self, shell: Shell, scheme: bytes = b"http", counted: bool = False) -> None:
        """`counted`: its arrival was counted against its client already (the TLS door
        does, before the handshake)."""
        self.shell = shell
        self.config = shell.config
        self.loop = shell.loop
        self.scheme = scheme
        self.counted = counted
        hsts = shell.hsts if scheme == b"https" else b""
        self.hsts = b"Strict-Transport-Security: %s\r\n" % hsts if hsts else b""
        self.max_body_bytes = self.config.max_body_bytes
        # the head reader and the parser are made with the connection's first bytes
        # (`_opening`): an idle connection, one refused for its client's limits or one
        # that turns out to be HTTP/2 costs neither (issue 28: an idle connection's memory)
        self.upgrade_body: Exchange | None = None  # see _resume_after_upgrade
        self.tunnel: Exchange | None = None  # a WebSocket upgrade: the client's bytes go there
        self.opening: bytes | None = b""  # the first bytes, while they may be an h2 preface
        self.parked = False  # idle, without parser, reader nor watchdog (`_park`)
        # bytes the client sent before the 101 (bounded), and how many; the list is made
        # when the first come (an idle connection's empty list would be 56 of its bytes)
        self.early: list[bytes] | None = None
        self.early_bytes = 0
        self.waiting = b""  # a request's first bytes, left for a later turn (_wait_turn)
        self.made_up_head = False
        self.transport: asyncio.Transport | None = None
        self.peer = b"unknown"
        self.trusted = False
        self.share: ClientState | None = None  # its client's (Shell.connection_opened)
        # (a list, not a deque: an empty deque is 624 bytes, a list 56; at most a few
        # pipelined requests wait here, so popping the first is as cheap)
        self.exchanges: list[Exchange] = []
        self.parsing: Exchange | None = None
        self.raw_head_bytes = 0
        self.in_head = False
        self.stopped = False  # no more parsing: a rejected request or a closing connection
        self.reject: tuple[str, str] | None = None
        self.pause_reasons = 0
        self.reading_paused = False
        self.write_paused = False
        self.closed = False
        self.rechunk = False  # the active exchange's answer goes out chunked
        self.pending_head = b""  # its response head not yet written: it goes with the body
        # one watchdog per connection, no timer per request: it checks these two times
        self.watchdog: asyncio.TimerHandle | None = None
        self.head_started = 0.0  # loop time the request head being read began
        self.last_active = 0.0  # loop time the connection last finished an exchange
        self.watch_every_s = self.config.watch_every_s

    # -- transport events ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.transport = transport
        transport.set_write_buffer_limits(high=self.config.write_buffer_high_bytes)
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = str(peer[0]).encode()
            self.trusted = self.shell.trust.trusts(self.peer)
        refused = self.shell.connection_opened(self, new=not self.counted)
        if refused is not None:  # the client is over its limits: 429 to it alone
            log.debug("refused a connection from %s: %s", self.peer.decode("latin-1"), refused)
            self.closed = self.stopped = True
            if refused == BARRED:  # cut for abuse: nothing written, a reset
                reset(transport)
                return
            transport.write(OVER_LIMITS)
            transport.close()
            return
        self.last_active = self.loop.time()
        self.watchdog = self.loop.call_later(self.watch_every_s, self._watch)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.stopped = True
        self.shell.connection_closed(self)
        self._cancel_timers()
        while self.exchanges:
            self.exchanges.pop(0).abort()

    def eof_received(self) -> bool:
        """The client sent all it will (a half-close): answer the requests it sent whole,
        then close. One cut off in its head or body is abandoned (the transport closes)."""
        if self.waiting:  # a request waiting for its turn: it is read now, turn or not
            data, self.waiting = self.waiting, b""
            self._feed(data)
        if self.parsing is not None or self.in_head or not self.exchanges or self.tunnel:
            return False  # (a tunnel's client closing its side ends the tunnel)
        self.exchanges[-1].close_after = True
        return True

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.exchanges and (upstream := self.exchanges[0].upstream) is not None:
            upstream.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.exchanges and (upstream := self.exchanges[0].upstream) is not None:
            upstream.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.tunnel is not None:
            self._tunnel_in(data)
            return
        if self.opening is not None:
            data = self._opening(data)
            if not data:
                return
        if not self.exchanges and not self.in_head and not self.shell.turn_take(self):
            self._wait_turn(data)  # a new request, and its client's turn is spent
            return
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        while not self.stopped:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade as upgrade:
                if self._tunnel_opened(data[int(upgrade.args[0]):]):
                    return
                # an h2c upgrade being ignored (any other was refused): the rest of `data`
                # is the body or the next request, for a new parser
                data = self._resume_after_upgrade(data[int(upgrade.args[0]):])
                continue
            except httptools.HttpParserError as exc:
                if self.config.h2 and not self.exchanges and data.startswith(PREFACE):
                    # llhttp stops at "PRI * HTTP/2.0": HTTP/2 with prior knowledge (no
                    # check on the warm path; a preface split across reads: `_opening`)
                    self._to_h2(data)
                    return
                if self.config.h2 and not self.exchanges and data.startswith(PREFACE_LINE):
                    self._broken_preface()
                    return
                found = self.reader.rejection
                code, message = self.reject or (
                    (found.code, found.message) if found
                    else ("bad_request", f"malformed HTTP: {exc}")
                )
                self._reject(code, message)
                return
            if self.in_head:
                # httptools keeps a partial header line to itself: count raw bytes too
                self.raw_head_bytes += len(data)
                if self.raw_head_bytes > self.config.max_header_bytes:
                    self._reject("headers_too_large", "request head too large")
            return

    def _wait_turn(self, data: bytes) -> None:
        """Keep a request's first bytes, unread, until the loop's next turn."""
        self.waiting += data
        if not self.pause_reasons & PAUSE_TURN:
            self.pause(PAUSE_TURN)
            self.loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        data, self.waiting = self.waiting, b""
        self.unpause(PAUSE_TURN)
        if data and not self.closed:
            self.data_received(data)

    # -- parser callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_head = True
        self.raw_head_bytes = 0
        self.head_started = self.loop.time()
        self.reader.reset()

    def on_headers_complete(self) -> None:
        self.in_head = False
        parser = self.parser
        upgrade = parser.should_upgrade()
        websocket = upgrade and self._accept_upgrade()
        keep_alive = parser.should_keep_alive()
        method = parser.get_method()
        head = self.reader.finish_usual() if keep_alive else None
        if head is not None:
            # Keep-alive with no Connection header is HTTP/1.1 by llhttp's own rule (1.0
            # needs `Connection: keep-alive`; it takes no other 1.x), so the version string
            # need not be made: the usual request skips it.
            http10 = False
        else:
            version = parser.get_http_version()
            decided = self.reader.finish(method, version, self.max_body_bytes)
            if isinstance(decided, Rejection):
                self.reject = (decided.code, decided.message)
                raise _Stop
            head = decided
            http10 = version == "1.0"
        exchange = Exchange(self.shell, self, method, head, keep_alive, http10)
        if websocket:
            exchange.upgrade = True
            exchange.close_after = True  # whatever the machine answers, nothing follows
            self.tunnel = exchange
        self.parsing = exchange
        exchanges = self.exchanges
        exchanges.append(exchange)
        if len(exchanges) > 1:
            self.pause(PAUSE_PIPELINE)
        elif head.expect_continue:
            self._start(exchange)
        else:
            self.shell.dispatch(exchange)  # what _start does for a request with no Expect
        if upgrade and not websocket and head.body != BODY_NONE:
            # llhttp ends an upgrade request at its head, body or not: the body is read
            # by the next parser (_resume_after_upgrade), and that early end is not its end
            self.parsing = None
            self.upgrade_body = exchange

    def on_body(self, body: bytes) -> None:
        exchange = self.parsing
        if exchange is None:
            return
        if exchange.received + len(body) > self.max_body_bytes:
            self.reject = ("body_too_large", f"body over {self.max_body_bytes} bytes")
            raise _Stop
        exchange.feed_body(body)

    def on_message_complete(self) -> None:
        exchange = self.parsing
        self.parsing = None
        if exchange is not None:
            exchange.end_body()

    # -- upgrades: WebSocket tunnelled, h2c ignored, others refused ------------------------

    def _accept_upgrade(self) -> bool:
        """True for a WebSocket upgrade (an HTTP/1.1 GET with no body: tunnelled after
        the machine's 101). An HTTP/1.1 upgrade to h2c alone is served as the HTTP/1.1
        request it also is (False; RFC 9113 dropped h2c upgrades; Upgrade and
        HTTP2-Settings are not forwarded). CONNECT and any other upgrade: 501, then close."""
        parser = self.parser
        if parser.get_method() != b"CONNECT" and parser.get_http_version() == "1.1":
            if self.reader.upgrades_to_websocket() and parser.get_method() == b"GET":
                return True
            if self.reader.upgrades_to_h2c_only():
                return False
        self.reject = ("upgrade_not_supported", "only WebSocket upgrades are supported")
        raise _Stop

    def _to_h2(self, data: bytes) -> None:
        """The client speaks HTTP/2 with prior knowledge: hand the transport to an
        H2Connection, with the bytes read so far. (Over TLS, ALPN chose: adapters/tls.py.)"""
        transport = self.transport
        assert transport is not None
        self._cancel_timers()
        self.closed = self.stopped = True
        self.shell.connection_closed(self)
        conn = H2Connection(self.shell, self.scheme, self.peer, counted=True)
        transport.set_protocol(conn)  # type: ignore[arg-type]
        conn.connection_made(transport)
        if data:
            conn.data_received(data)

    def _broken_preface(self) -> None:
        """An HTTP/2 preface that strays after its first line: the client speaks HTTP/2,
        badly; it gets HTTP/2's answer, GOAWAY PROTOCOL_ERROR, not an HTTP/1.1 400."""
        self.stopped = True
        transport = self.transport
        if transport is not None:
            transport.write(FRAME_HEAD.pack(0, 8, GOAWAY, 0, 0) + U32.pack(0)
                            + U32.pack(PROTOCOL_ERROR))
            transport.close()

    def _opening(self, data: bytes) -> bytes:
        """A connection's first bytes (or a parked one's, `_park`): while they could be the
        start of the HTTP/2 preface they are kept (b""), so that a preface split across
        reads reaches llhttp whole; then the bytes to parse."""
        if self.parked:
            self.parked = False
            self.shell.unpark(self)
            self.watchdog = self.loop.call_later(self.watch_every_s, self._watch)
        data = self.opening + data if self.opening else data
        if self.config.h2 and len(data) < len(PREFACE) and PREFACE.startswith(data):
            self.opening = data
            return b""
        self.opening = None
        config = self.config
        self.reader = RequestHeadReader(config.max_headers, config.max_header_bytes,
                                        underscore_headers=config.underscore_headers)
        self.parser = self._new_parser(False)
        return data

    def _tunnel_opened(self, rest: bytes) -> bool:
        """After the head of an upgrade: a WebSocket one takes the rest of the bytes. (Its
        own method: in data_received, mypy's narrowing of `self.tunnel` to None would
        outlive the parser callback that sets it, and the compiled check would fail.)"""
        if self.tunnel is None:
            return False
        if rest:
            self._tunnel_in(rest)
        return True

    def _tunnel_in(self, data: bytes) -> None:
        """Bytes from the client of a WebSocket upgrade: to the machine once its 101 came,
        kept (up to `body_buffer_bytes`, then reading pauses) until then."""
        exchange = self.tunnel
        if exchange is None or exchange.ended:
            return
        if exchange.phase == Phase.TUNNEL:
            exchange.to_machine(data)
            return
        if self.early is None:
            self.early = [data]
        else:
            self.early.append(data)
        self.early_bytes += len(data)
        if self.early_bytes > self.config.body_buffer_bytes:
            self.pause(PAUSE_BUFFER)

    def _resume_after_upgrade(self, rest: bytes) -> bytes:
        """A parser for what follows an ignored h2c upgrade (llhttp's stops for good after
        one), and the bytes to feed it. A body the upgrade request announced is framed
        by llhttp too: the bytes start with a made-up head of the same framing, whose
        end `_headers_after_upgrade` skips."""
        exchange = self.upgrade_body
        self.upgrade_body = None
        if exchange is None:
            self.parser = self._new_parser(False)
            return rest
        self.parsing = exchange
        self.made_up_head = True
        self.parser = self._new_parser(True)
        head = exchange.head
        if head.body == BODY_CHUNKED:
            framing = b"Transfer-Encoding: chunked"
        else:
            framing = b"Content-Length: %d" % head.content_length
        return b"POST / HTTP/1.1\r\n" + framing + b"\r\n\r\n" + rest

    def _headers_after_upgrade(self) -> None:
        if self.made_up_head:
            self.made_up_head = False  # no request here: the announced body follows
            self.in_head = False
        else:
            self.on_headers_complete()

    def _new_parser(self, made_up_head: bool) -> httptools.HttpRequestParser:
        # The head's URL and headers go straight from the parser to the pure reader.
        return httptools.HttpRequestParser(SimpleNamespace(
            on_message_begin=self.on_message_begin, on_url=self.reader.on_url,
            on_header=self.reader.on_header,
            on_headers_complete=(self._headers_after_upgrade if made_up_head
                                 else self.on_headers_complete),
            on_body=self.on_body, on_message_complete=self.on_message_complete,
        ))

    # -- exchanges -----------------------------------------------------------------------

    def _start(self, exchange: Exchange) -> None:
        if exchange.error is not None:
            exchange.fail(exchange.error[0])
            return
        if exchange.head.expect_continue and not exchange.body_done:
            self.write(CONTINUE)
        self.shell.dispatch(exchange)

    # -- answers, as the exchanges' Downstream -------------------------------------------

    def send_head(self, exchange: Exchange, status: int, head: ResponseHead) -> None:
        framing, self.rechunk, exchange.close_after = response_framing(
            head.body, head.content_length, exchange.http10, exchange.body_done,
            exchange.close_after)
        timing = b"Server-Timing: %s\r\n" % exchange.timing() if exchange.held_at else b""
        hsts = self.hsts if self.hsts and not sets_hsts(head.forward) else b""
        data = b"".join((status_line(status), head.forward, framing, timing, hsts, CRLF))
        if head.body == BODY_LENGTH:
            self.pending_head = data  # goes out with the body: one send
        else:
            self.write(data)  # streams (SSE, long polls) see headers now

    def send_body(self, exchange: Exchange, data: bytes) -> None:
        head, self.pending_head = self.pending_head, b""
        if self.rechunk:
            self.writelines([b"%x\r\n" % len(data), data, CRLF])
        elif not head:
            self.write(data)
        elif len(data) < 16384:
            self.write(head + data)  # one send for small answers
        else:
            self.writelines([head, data])

    def send_end(self, exchange: Exchange, trailers: bytes) -> None:
        head, self.pending_head = self.pending_head, b""
        if self.rechunk:  # (trailers can follow a chunked body only)
            self.rechunk = False
            self.write(head + last_chunk(trailers))
        elif head:
            self.write(head)

    def send_error(self, exchange: Exchange, code: str) -> None:
        self.pending_head = b""
        self.rechunk = False
        self.write(error_response(
            code, keep_alive=not exchange.close_after,
            retry_after_s=self.config.wake_retry_after_s,
            head_request=exchange.method == b"HEAD",
        ))

    def cut(self, exchange: Exchange) -> None:
        self.abort_transport()

    def open_tunnel(self, exchange: Exchange, head: ResponseHead) -> None:
        self.write(b"".join((status_line(101), head.forward,
                             b"Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n")))
        early, self.early, self.early_bytes = self.early, None, 0
        if early:
            exchange.to_machine(b"".join(early))
            self.unpause(PAUSE_BUFFER)

    def tunnel_data(self, exchange: Exchange, data: bytes) -> None:
        self.write(data)

    def exchange_done(self, exchange: Exchange) -> None:
        """`exchange` (the active one) has answered; start the next or close."""
        if self.exchanges and self.exchanges[0] is exchange:
            self.exchanges.pop(0)
        if exchange.close_after or self.closed:
            self.stopped = True
            self._close()
            return
        if len(self.exchanges) <= 1 and self.pause_reasons & PAUSE_PIPELINE:
            self.unpause(PAUSE_PIPELINE)
        if self.exchanges:
            self._start_queued()
        else:
            self.last_active = self.loop.time()

    def _start_queued(self) -> None:
        """The next pipelined request starts, within its client's share of this turn (or
        in a later turn)."""
        if self.closed or not self.exchanges:
            return
        if self.shell.turn_take(self):
            self._start(self.exchanges[0])
        else:
            self.loop.call_soon(self._start_queued)

    def _reject(self, code: str, message: str) -> None:
        """Stop parsing and answer `code` after the exchanges already queued, then close.
        The answer says the code and its fixed message; `message` goes to the debug log."""
        log.debug("rejected a request from %s: %s: %s", self.peer.decode("latin-1"), code,
                  message)
        self.stopped = True
        self.in_head = False
        self.pause(PAUSE_PIPELINE)
        parsing = self.parsing
        if parsing is not None and not parsing.ended:
            if parsing is self.exchanges[0] and not parsing.response_started:
                parsing.fail(code)
            else:
                self.abort_transport()
            return
        if not self.exchanges:
            self._answer_and_close(code, message)
            return
        placeholder = Exchange(self.shell, self, b"", _placeholder_head(), False, False)
        placeholder.error = (code, message)
        self.exchanges.append(placeholder)

    def _answer_and_close(self, code: str, message: str) -> None:
        self.shell.count_rejected(code)
        self.write(error_response(code, message, keep_alive=False))
        self._close()

    # -- IO helpers ----------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def writelines(self, parts: list[bytes]) -> None:
        if self.transport is not None and not self.closed:
            self.transport.writelines(parts)

    def pause(self, reason: int) -> None:
        self.pause_reasons |= reason
        if not self.reading_paused and self.transport is not None and not self.closed:
            self.reading_paused = True
            self.transport.pause_reading()

    def unpause(self, reason: int) -> None:
        if not self.pause_reasons & reason:
            return  # reading is paused only while some reason is set: nothing changes
        self.pause_reasons &= ~reason
        if self.reading_paused and not self.pause_reasons and not self.closed:
            self.reading_paused = False
            assert self.transport is not None
            self.transport.resume_reading()

    def _close(self) -> None:
        self._cancel_timers()
        if self.transport is not None:
            self.transport.close()

    def abort_transport(self) -> None:
        self.stopped = True
        if self.transport is not None:
            self.transport.abort()

    def _park(self) -> None:
        """Idle for a whole watchdog period, between requests: the connection gives up its
        parser and head reader (the next bytes make new ones, in `_opening`) and its
        timer (the shell's one sweep closes it after `idle_timeout_s`), as nginx frees a
        keep-alive connection's request buffers. Only its transport and this object are
        left (issue 28: an idle connection's memory)."""
        self.parked = True
        self.opening = b""
        self.reader = IDLE_READER
        self.parser = IDLE_PARSER
        self.shell.park(self, self.last_active)

    def close_if_idle(self) -> bool:
        if not self.exchanges and not self.waiting:  # (a request waiting for its turn)
            self._close()
            return True
        return False

    def _watch(self) -> None:
        """Header-read deadline (408, or a cut when an exchange is active) and idle close."""
        self.watchdog = None
        if self.closed:
            return
        now = self.loop.time()
        if self.in_head and now - self.head_started >= self.config.header_timeout_s:
            self.in_head = False
            if self.exchanges:
                self.abort_transport()
            else:
                self.stopped = True
                self._answer_and_close("request_timeout", "request head not received in time")
            return
        if not self.exchanges and not self.in_head and not self.waiting:
            if now - self.last_active >= self.config.idle_timeout_s:
                self._close()
                return
            if (not self.opening and self.tunnel is None and not self.stopped
                    and now - self.last_active >= self.watch_every_s):
                self._park()  # idle a whole period: the shell's sweep watches it now
                return
        if self.exchanges:
            active = self.exchanges[0]
            stalled_s = now - active.progress_at
            if (Phase.FORWARDING <= active.phase <= Phase.RESPONDING
                    and stalled_s >= self.config.response_timeout_s):
                # a machine that accepted and went quiet (hung, frozen, or fed half a body)
                self.shell.fail(active, "upstream_timeout",
                               f"the machine sent nothing for {stalled_s:.1f}s")
                if self.closed:
                    return
            elif (active.phase == Phase.TUNNEL
                    and stalled_s >= self.config.tunnel_idle_timeout_s):
                self.shell.fail(active, "upstream_timeout",
                                f"the tunnel was idle for {stalled_s:.1f}s")
                return
        self.watchdog = self.loop.call_later(self.watch_every_s, self._watch)

    def _cancel_timers(self) -> None:
        if self.watchdog is not None:
            self.watchdog.cancel()
            self.watchdog = None
