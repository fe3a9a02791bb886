"""The machine side of the data path: HTTP/1.1 keep-alive connections parsed with httptools.

One request at a time per connection; after a complete response whose framing
allows it the connection goes back to its machine's idle pool. A connection
lost before any response byte is reported as such, so the shell can decide
whether the request may be sent again. It is the `Upstream` of its exchange.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import httptools

from edge.core.framing import (
    BODY_CHUNKED,
    BODY_NONE,
    BODY_UNTIL_CLOSE,
    CRLF,
    ResponseHead,
    last_chunk,
)
from edge.core.headreader import ResponseHeadReader
from edge.exchange import Exchange, Shell, Upstream
from edge.view import MachineSlot

if TYPE_CHECKING:
    from edge.adapters.h2pool import H2Pool

QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)  # Linux only


class UpstreamConnection(Upstream):
    """An asyncio protocol by its methods (see ClientConnection)."""

    def __init__(self, pool: UpstreamPool, address: str) -> None:
        self.pool = pool
        self.address = address
        self.reader = ResponseHeadReader()
        self.parser = self._new_parser()
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.got_bytes = False
        self.skip_interim = False
        self.head_only = False
        self.response: ResponseHead | None = None
        self.keep_alive = True
        self.closed = False
        self.reading_paused = False
        self.idle_since = 0.0
        self.used = 0
        self.acked = False  # this response's early ACK was asked for
        self.tunnel = False  # a 101 switched this connection to a tunnel: bytes as they come
        self.severed = False  # cut by the edge: its machine's host is lost

    def _new_parser(self) -> httptools.HttpResponseParser:
        """The headers go straight from the parser to the pure reader (the status line's
        reason phrase is not read: the edge sends the standard one)."""
        reader = self.reader
        return httptools.HttpResponseParser(SimpleNamespace(
            on_header=reader.on_header, on_headers_complete=self.on_headers_complete,
            on_body=self.on_body, on_message_complete=self.on_message_complete,
        ))

    # -- driven by the exchange ----------------------------------------------------------

    def send(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.got_bytes = False
        self.response = None
        self.head_only = False
        self.acked = False
        self.used += 1
        exchange.attach(self)

    def send_request(self, exchange: Exchange) -> None:
        transport = self.transport
        if transport is None or self.closed:
            return
        chunks = exchange.chunks
        if exchange.head.body == BODY_CHUNKED:
            parts = [exchange.upstream_head]
            for chunk in chunks:
                parts += (b"%x\r\n" % len(chunk), chunk, CRLF)
            if exchange.body_done:
                parts.append(last_chunk(exchange.trailers))
            transport.writelines(parts)
        elif chunks:
            transport.writelines([exchange.upstream_head, *chunks])
        else:
            transport.write(exchange.upstream_head)  # no body, or none read yet

    def send_data(self, exchange: Exchange, data: bytes) -> None:
        transport = self.transport
        if transport is None or self.closed:
            return
        if exchange.head.body == BODY_CHUNKED:
            transport.writelines([b"%x\r\n" % len(data), data, CRLF])
        else:
            transport.write(data)

    def send_end(self, exchange: Exchange, trailers: bytes) -> None:
        if exchange.head.body == BODY_CHUNKED:
            self.write(last_chunk(trailers))

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed and self.reading_paused:
            self.reading_paused = False
            self.transport.resume_reading()

    def abandon(self) -> None:
        """The exchange no longer wants this response: the connection cannot be reused."""
        self.exchange = None
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def sever(self) -> None:
        """Cut the connection now, mid-exchange too: its machine's host is lost, and no
        answer, not even a reset, will come from it. The exchange sees the loss (and goes
        out again if it may)."""
        self.severed = True
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # -- transport events ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.transport = transport
        transport.set_write_buffer_limits(high=self.pool.write_buffer_high_bytes)

    def eof_received(self) -> bool:
        return False  # the machine ended its side: close ours (connection_lost follows)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        exchange = self.exchange
        self.exchange = None
        if exchange is None:
            return
        exchange.upstream_busy(False)
        if self.tunnel:
            exchange.tunnel_closed()  # the machine closed its side: so does the client's
            return
        response = self.response
        if (response is not None and response.body == BODY_UNTIL_CLOSE and exc is None
                and not self.severed):
            exchange.response_end()  # a clean close is the end of this body (a reset is not)
        else:
            self.pool.shell.upstream_lost(exchange, self.got_bytes, self.used > 1)

    def pause_writing(self) -> None:
        if self.exchange is not None:
            self.exchange.upstream_busy(True)

    def resume_writing(self) -> None:
        if self.exchange is not None:
            self.exchange.upstream_busy(False)

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None:
            self.close()  # bytes nobody asked for: the connection is out of step
            return
        if self.tunnel:
            exchange.to_client(data)
            return
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:  # after a 101: the rest is tunnel
            rest = data[int(upgrade.args[0]):]
            if rest and self.tunnel:
                exchange.to_client(rest)
            return
        except httptools.HttpParserError as exc:
            exchange = self.exchange
            self.exchange = None
            self.close()
            if exchange is not None:
                self.pool.shell.fail(exchange, "bad_gateway",
                                    f"machine sent a malformed response: {exc}")
            return
        if self.head_only:
            # llhttp would wait for a HEAD response's body: start a fresh parser instead
            self.parser = self._new_parser()
            self.head_only = False
            self._complete()
        elif not self.acked and self.pool.quickack:
            self._ack_now()

    def _ack_now(self) -> None:
        """The response is split across reads: acknowledge what came at once. An app that
        writes its head and its body apart with Nagle on (Python's http.server does) sends
        the body only when the head is acknowledged, and the kernel would delay that ACK
        ~40 ms. Once per response, and only for those that did not come in one read.
        (Its own method: in data_received, mypy's narrowing of `self.exchange` to not-None
        outlives the parser callbacks that clear it, and the compiled check would fail.)"""
        if self.exchange is None:  # the response was complete
            return
        self.acked = True
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is not None and QUICKACK is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)

    # -- parser callbacks ----------------------------------------------------------------

    def on_headers_complete(self) -> None:
        exchange = self.exchange
        if exchange is None:
            return
        parser = self.parser
        status = parser.get_status_code()
        if status == 101 and exchange.upgrade:
            self.tunnel = True
            exchange.upgraded(self.reader.finish(status, False))
            return
        if 100 <= status < 200:
            self.skip_interim = True  # 1xx: the edge answered Expect itself
            self.reader.reset()
            return
        head_request = exchange.method == b"HEAD"
        reader = self.reader
        response = reader.finish(status, head_request)
        self.response = response
        self.keep_alive = parser.should_keep_alive() and not response.close
        exchange.response_head(status, response)
        if head_request and response.body == BODY_NONE:
            self.head_only = True

    def on_body(self, body: bytes) -> None:
        if self.exchange is not None and not self.skip_interim:
            self.exchange.response_body(body)

    def on_message_complete(self) -> None:
        if self.tunnel:
            return
        if self.skip_interim:
            self.skip_interim = False
            return
        if not self.head_only:
            reader = self.reader
            if reader.forward or reader.special:  # trailers: fields after a chunked body
                trailers = b"".join(reader.forward)  # (hop-by-hop ones were not kept)
                reader.reset()  # never left for the next response's head
                self._complete(trailers)
            else:
                self._complete()

    def _complete(self, trailers: bytes = b"") -> None:
        exchange = self.exchange
        self.exchange = None
        if exchange is None:
            return
        self.pool.release(self, self.keep_alive and exchange.sent_all)
        exchange.response_end(trailers)  # its finish() lifts the client's PAUSE_UPSTREAM


class UpstreamPool:
    """Idle keep-alive connections per machine address, and every open one (to cut them
    all when a machine's host is lost: tracked per connection, not per request)."""

    def __init__(self, shell: Shell) -> None:
        self.shell = shell
        self.loop = shell.loop
        config = shell.config
        self.write_buffer_high_bytes = config.write_buffer_high_bytes
        self.max_idle = config.upstream_pool_per_machine
        self.idle_timeout_s = config.upstream_idle_timeout_s
        self.quickack = config.upstream_quickack
        self.connect_timeout_s = config.upstream_connect_timeout_s
        self.idle: dict[str, list[UpstreamConnection]] = {}
        self.open: dict[str, set[UpstreamConnection]] = {}
        self.accepted = 0
        self.h2: H2Pool | None = None  # connections to h2c machines, once there is one

    def h2pool(self) -> H2Pool:
        """The HTTP/2 connections to machines of apps whose protocol is h2c (made on
        first use: an edge without such apps never loads the HTTP/2 client)."""
        if self.h2 is None:
            from edge.adapters.h2pool import H2Pool

            self.h2 = H2Pool(self.shell)
        return self.h2

    def acquire(self, address: str) -> UpstreamConnection | None:
        conns = self.idle.get(address)
        while conns:
            conn = conns.pop()
            transport = conn.transport
            if not conn.closed and transport is not None and not transport.is_closing():
                return conn
        return None

    async def connect(self, slot: MachineSlot) -> UpstreamConnection:
        """A new connection to `slot`; OSError or TimeoutError when it cannot be made."""
        conn = UpstreamConnection(self, slot.pool_key)
        async with asyncio.timeout(self.connect_timeout_s):
            await self.loop.create_connection(
                lambda: cast(asyncio.Protocol, conn), slot.host, slot.port
            )
        if not conn.closed:
            opened = self.open.get(slot.pool_key)
            if opened is None:
                opened = self.open[slot.pool_key] = set()
            opened.add(conn)
        return conn

    async def preconnect(self, slot: MachineSlot) -> None:
        """One connection to `slot` made ahead of its first request and kept idle for it:
        a suspended machine's, while its agent thaws it (the kernel completes the handshake
        of a frozen app's listening socket; the request is sent once it runs). Unused, it
        is closed as any idle one (`close_stale`)."""
        try:
            conn = await self.connect(slot)
        except (OSError, TimeoutError):
            return  # the request's own connect will say what is wrong
        self.release(conn, True)

    def release(self, conn: UpstreamConnection, reusable: bool) -> None:
        if reusable and not conn.closed:
            conns = self.idle.get(conn.address)
            if conns is None:
                conns = self.idle[conn.address] = []
            if len(conns) < self.max_idle:
                if conn.reading_paused:  # a slow client paused it for the last bytes
                    conn.resume_reading()
                conn.idle_since = self.loop.time()
                conns.append(conn)
                return
        conn.close()

    def forget(self, conn: UpstreamConnection) -> None:
        conns = self.idle.get(conn.address)
        if conns and conn in conns:
            conns.remove(conn)
        opened = self.open.get(conn.address)
        if opened is not None:
            opened.discard(conn)
            if not opened:
                del self.open[conn.address]

    def close_address(self, address: str) -> None:
        for conn in self.idle.pop(address, []):
            conn.close()
        if self.h2 is not None:
            self.h2.close_address(address)

    def sever_address(self, address: str) -> None:
        """Cut every connection to `address`, idle or mid-exchange (its host is lost)."""
        self.close_address(address)
        for conn in list(self.open.get(address, ())):
            conn.sever()
        if self.h2 is not None:
            self.h2.sever_address(address)

    def close_stale(self) -> None:
        """Close idle connections older than the idle timeout (machines may close them first)."""
        cutoff = self.loop.time() - self.idle_timeout_s
        for conns in self.idle.values():
            for conn in [c for c in conns if c.idle_since < cutoff]:
                conns.remove(conn)
                conn.close()
        if self.h2 is not None:
            self.h2.close_stale()

    def close_all(self) -> None:
        for address in list(self.idle):
            self.close_address(address)
        if self.h2 is not None:
            self.h2.close_all()
