"""TLS termination: the edge's certificates, SNI, ALPN, and the TLS front door.

`TlsConfig` (edge/config.py) names a default certificate (`cert`, `key`) and/or a directory of
certificates chosen by SNI: `NAME.pem` (certificate chain and key in one file)
or `NAME.crt` + `NAME.key`, where NAME is the host name it serves
(`*.example.com` for a wildcard). A name with no certificate gets the default
one, or the directory's first in name order.

Modern defaults: TLS 1.2 and 1.3 only, TLS 1.2 with ECDHE and AEAD suites only
(AES-GCM, ChaCha20-Poly1305: no CBC, which testssl flags for LUCKY13), no
compression, the server's cipher order, ALPN `h2` (when the edge serves HTTP/2)
and `http/1.1` on the same port. `hsts_max_age_s` adds Strict-Transport-Security
to answers over TLS (unless the machine sent its own).

The door accepts connections itself and hands each to the loop's TLS
(`loop.connect_accepted_socket`, the same SSLProtocol as `create_server(ssl=)`):
so it knows when a handshake ends, done or failed, and can bound them
(edge/core/handshakes.py): at most `max_handshakes` in progress (a connection
past it is closed at once), each closed if not through in `handshake_timeout_s`,
and after a burst of failed ones the memory they freed is given back to the
system (glibc's malloc_trim; without it the edge's RSS only climbs with the
handshakes clients abort, issue 26).

Session tickets are rotated: Python's ssl module cannot set or rotate a
context's ticket keys, and a context keeps the keys it was made with for its
life (which would weaken forward secrecy), so every `rotate_s` the contexts
are made again — new ticket keys, and certificate files re-read — and the
connections accepted after that get them. A ticket of the previous keys gets a
full handshake. (A handshake through `loop.start_tls` on a plain connection was
tried first: under uvloop, concurrent server-side `start_tls` handshakes
stalled.)
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import cast

from edge.adapters.http1 import ClientConnection
from edge.adapters.http2 import H2Connection
from edge.config import TlsConfig
from edge.core.handshakes import TRIM_DELAY_S, Handshakes
from edge.exchange import Shell

log = logging.getLogger("thaw.edge.tls")
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"

ACCEPTS_PER_TURN = 64  # connections accepted each time a listening socket is ready
ACCEPT_RETRY_S = 1.0  # out of descriptors or memory: accepting pauses this long
REFUSED_LOG_EVERY_S = 60.0  # connections closed at max_handshakes: a warning at most this often


def _context(alpn: list[str]) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # no renegotiation: RFC 9113 9.2.1 forbids it under h2, and it is a DoS lever
    context.options |= (ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
                        | ssl.OP_NO_RENEGOTIATION)
    # TLS 1.2 with forward-secret AEAD suites only (no CBC: LUCKY13; no RSA key exchange);
    # TLS 1.3's suites are all AEAD and not set here
    context.set_ciphers(TLS12_CIPHERS)
    context.set_alpn_protocols(alpn)
    return context


def _files(cert_dir: Path) -> dict[str, tuple[Path, Path]]:
    """SNI name -> (certificate file, key file) found in `cert_dir`."""
    found: dict[str, tuple[Path, Path]] = {}
    for path in sorted(cert_dir.iterdir()):
        name = path.stem.lower().rstrip(".")
        if path.suffix == ".pem":
            found[name] = (path, path)
        elif path.suffix == ".crt" and path.with_suffix(".key").exists():
            found[name] = (path, path.with_suffix(".key"))
    return found


class Certificates:
    """The SSL contexts of one generation: a default one and one per SNI name."""

    def __init__(self, config: TlsConfig, alpn: list[str]) -> None:
        self.config = config
        self.alpn = alpn
        self.by_name: dict[str, ssl.SSLContext] = {}
        if config.cert_dir:
            for name, (cert, key) in _files(Path(config.cert_dir)).items():
                context = _context(alpn)
                context.load_cert_chain(cert, key)
                self.by_name[name] = context
        if config.cert:
            self.default = _context(alpn)
            self.default.load_cert_chain(config.cert, config.key)
        elif self.by_name:
            self.default = _context(alpn)
            first = _files(Path(config.cert_dir))[next(iter(self.by_name))]
            self.default.load_cert_chain(*first)
        else:  # an issuer only: the default is made for "localhost"
            self.default = self._issued("localhost") or _context(alpn)
        self.default.sni_callback = self._pick

    def _issued(self, name: str) -> ssl.SSLContext | None:
        issuer = self.config.issuer
        made = issuer(name) if issuer is not None else None
        if made is None:
            return None
        import tempfile  # load_cert_chain reads files only

        with tempfile.NamedTemporaryFile("wb", suffix=".pem") as pem:
            pem.write(made[0] + made[1])
            pem.flush()
            context = _context(self.alpn)
            context.load_cert_chain(pem.name)
        return context

    def context_for(self, name: str) -> ssl.SSLContext | None:
        name = name.lower().rstrip(".")
        found = self.by_name.get(name)
        if found is None and "." in name:
            found = self.by_name.get("*." + name.split(".", 1)[1])
        # local development only: a bounded number of names, each issued once per generation
        if found is None and self.config.issuer is not None and len(self.by_name) < 256:
            found = self._issued(name)
            if found is not None:
                self.by_name[name] = found
        return found

    def _pick(self, sslobj: ssl.SSLObject, name: str | None, _: ssl.SSLContext) -> None:
        if name:
            context = self.context_for(name)
            if context is not None:
                sslobj.context = context


class TlsDoor:
    """The HTTPS listener: it accepts, runs the TLS handshake (the event loop's) of at
    most `max_handshakes` connections at once, each within `handshake_timeout_s`
    (edge/core/handshakes.py), and the connection goes to HTTP/2 (ALPN h2) or HTTP/1.1.
    Every `rotate_s` the contexts are made again; connections accepted after that get
    them."""

    def __init__(self, shell: Shell, config: TlsConfig, h2: bool, host: str) -> None:
        self.shell = shell
        self.config = config
        self.host = host
        self.alpn = ["h2", "http/1.1"] if h2 else ["http/1.1"]
        self.certificates = Certificates(config, self.alpn)
        self.handshakes = Handshakes(config.max_handshakes)
        self.port = config.port
        self._listeners: list[socket.socket] = []
        self._in_handshake: set[asyncio.Task[None]] = set()
        self._rotator: asyncio.Task[None] | None = None
        self._trim: asyncio.TimerHandle | None = None
        self._quiet_until = 0.0  # no warning of refused connections before (loop time)

    async def start(self) -> int:
        self._listeners = await _listening(self.shell.loop, self.host, self.config.port)
        self.port = self._listeners[0].getsockname()[1]
        for listener in self._listeners:
            self._resume(listener)
        self._rotator = self.shell.loop.create_task(self._rotate_forever())
        return self.port

    async def stop(self) -> None:
        """No more connections; those still in their handshake are closed."""
        for listener in self._listeners:
            self.shell.loop.remove_reader(listener.fileno())
            listener.close()
        self._listeners = []
        tasks = [t for t in (self._rotator, *self._in_handshake) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._trim is not None:
            self._trim.cancel()

    def _resume(self, listener: socket.socket) -> None:
        if listener in self._listeners:  # (not stopped meanwhile)
            self.shell.loop.add_reader(listener.fileno(), self._accept, listener)

    def _accept(self, listener: socket.socket) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            try:  # the bare descriptor: a refused connection costs no socket object
                fd, address = listener._accept()  # type: ignore[attr-defined]
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:  # out of descriptors or memory: pause, as asyncio does
                log.warning("TLS port: accepting paused for %.0f s: %s", ACCEPT_RETRY_S, exc)
                self.shell.loop.remove_reader(listener.fileno())
                self.shell.loop.call_later(ACCEPT_RETRY_S, self._resume, listener)
                return
            if not self.shell.client_arrives(str(address[0]).encode()):
                os.close(fd)  # its client is barred or over its new connections
                continue
            if not self.handshakes.admit():
                os.close(fd)  # before any TLS state is made for it
                self._say_refused()
                continue
            sock = socket.socket(listener.family, socket.SOCK_STREAM, fileno=fd)
            sock.setblocking(False)
            task = self.shell.loop.create_task(self._handshake(sock))
            self._in_handshake.add(task)
            task.add_done_callback(self._in_handshake.discard)

    def _say_refused(self) -> None:
        now = self.shell.loop.time()
        if now >= self._quiet_until:
            self._quiet_until = now + REFUSED_LOG_EVERY_S
            log.warning("TLS port: %d handshakes in progress (max_handshakes), new "
                        "connections are closed (%d so far)", self.handshakes.limit,
                        self.handshakes.refused)

    async def _handshake(self, sock: socket.socket) -> None:
        alpn = _Alpn(self.shell)
        try:
            await self.shell.loop.connect_accepted_socket(
                lambda: cast(asyncio.Protocol, alpn), sock, ssl=self.certificates.default,
                ssl_handshake_timeout=self.config.handshake_timeout_s)
        except OSError as exc:  # the client left, spoke no TLS or took too long: closed
            # the stdlib loop's sslproto (before CPython gh-114074) leaves this traceback in
            # a reference cycle with its frames, which keeps the connection's SSLProtocol
            # (and its 256 KB buffer) until a full collection of the cyclic GC
            exc.__traceback__ = None
        finally:
            if self.handshakes.ended(alpn.handed_over):
                self._trim = self.shell.loop.call_later(TRIM_DELAY_S, self._give_back)

    def _give_back(self) -> None:
        """The memory the failed handshakes freed goes back to the system."""
        self._trim = None
        if self.handshakes.trimmed():
            self._trim = self.shell.loop.call_later(TRIM_DELAY_S, self._give_back)
        if _malloc_trim is not None:
            _malloc_trim(0)

    async def _rotate_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.rotate_s)
            try:
                self.certificates = Certificates(self.config, self.alpn)
            except (OSError, ssl.SSLError) as exc:  # keep serving with the last good ones
                log.warning("TLS certificates could not be made again: %s", exc)
                continue
            log.info("TLS contexts made again (new session ticket keys)")


async def _listening(loop: asyncio.AbstractEventLoop, host: str,
                     port: int) -> list[socket.socket]:
    """Non-blocking sockets listening on `port` at each address of `host` ("": all), as
    `loop.create_server` makes them."""
    infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    listeners: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            listeners.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:  # worded as create_server words it
                why = (exc.strerror or str(exc)).lower()
                raise OSError(exc.errno, f"error while attempting to bind on address "
                                         f"{address!r}: {why}") from None
            sock.listen(4096)
            sock.setblocking(False)
    except OSError:
        for sock in listeners:
            sock.close()
        raise
    return listeners


def _libc_malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None (another libc)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    return cast(Callable[[int], int], trim)


_malloc_trim = _libc_malloc_trim()


class _Alpn:
    """The protocol of a TLS connection when its handshake is done: it hands the
    connection to HTTP/2 or HTTP/1.1 by the protocol ALPN chose."""

    def __init__(self, shell: Shell) -> None:
        self.shell = shell
        self.handed_over = False  # the handshake was done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.handed_over = True
        tls = cast(asyncio.Transport, transport)
        ssl_object = tls.get_extra_info("ssl_object")
        chosen = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        conn: ClientConnection | H2Connection
        if chosen == "h2":
            conn = H2Connection(self.shell, b"https", counted=True)  # counted at accept
        else:
            conn = ClientConnection(self.shell, b"https", counted=True)
        tls.set_protocol(cast(asyncio.BaseProtocol, conn))
        conn.connection_made(tls)

    def connection_lost(self, exc: Exception | None) -> None:
        pass

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False
