"""TLS termination: the edge's certificates, SNI, ALPN, and the TLS front door.

`TlsConfig` (edge/config.py) names a default certificate (`cert`, `key`) and/or a directory of
certificates chosen by SNI: `NAME.pem` (certificate chain and key in one file)
or `NAME.crt` + `NAME.key`, where NAME is the host name it serves
(`*.example.com` for a wildcard). A name with no certificate gets the default
one, or the directory's first in name order.

Modern defaults: TLS 1.2 and 1.3 only, no compression, the server's cipher
order, ALPN `h2` (when the edge serves HTTP/2) and `http/1.1` on the same port.

Session tickets are rotated: Python's ssl module cannot set or rotate a
context's ticket keys, and a context keeps the keys it was made with for its
life (which would weaken forward secrecy), so every `rotate_s` the contexts
are made again — new ticket keys, and certificate files re-read — and a new
listener with them takes over the port: it listens (SO_REUSEPORT) before the
old one closes. A ticket of the previous keys gets a full handshake.
Connections that sat in the old listener's accept queue at that instant are
reset by the kernel (unless `net.ipv4.tcp_migrate_req = 1`); the loop accepts
as they come, so the queue is short. (A handshake per connection through
`loop.start_tls`, with the current contexts, was tried first: under uvloop,
concurrent server-side `start_tls` handshakes stalled.)
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path
from typing import cast

from edge.adapters.http1 import ClientConnection
from edge.adapters.http2 import H2Connection
from edge.config import TlsConfig
from edge.exchange import Shell

log = logging.getLogger("thaw.edge.tls")


def _context(alpn: list[str]) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # no renegotiation: RFC 9113 9.2.1 forbids it under h2, and it is a DoS lever
    context.options |= (ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
                        | ssl.OP_NO_RENEGOTIATION)
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
    """The HTTPS listener: the TLS handshake (the event loop's), then the connection goes to
    HTTP/2 (ALPN h2) or HTTP/1.1. Every `rotate_s` a listener with new contexts takes
    over the port (SO_REUSEPORT: the new one listens before the old one closes)."""

    def __init__(self, shell: Shell, config: TlsConfig, h2: bool, host: str) -> None:
        self.shell = shell
        self.config = config
        self.host = host
        self.alpn = ["h2", "http/1.1"] if h2 else ["http/1.1"]
        self.certificates = Certificates(config, self.alpn)
        self.server: asyncio.Server | None = None
        self.port = config.port
        self._rotator: asyncio.Task[None] | None = None

    async def start(self) -> int:
        self.server = await self._listen(self.certificates)
        self.port = self.server.sockets[0].getsockname()[1]
        self._rotator = self.shell.loop.create_task(self._rotate_forever())
        return self.port

    async def _listen(self, certificates: Certificates) -> asyncio.Server:
        return await self.shell.loop.create_server(
            lambda: cast(asyncio.Protocol, _Alpn(self.shell)), self.host, self.port,
            ssl=certificates.default, ssl_handshake_timeout=self.shell.config.header_timeout_s,
            backlog=4096, reuse_address=True, reuse_port=True)

    async def stop(self) -> None:
        if self._rotator is not None:
            self._rotator.cancel()
        if self.server is not None:
            self.server.close()

    async def _rotate_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.rotate_s)
            try:
                certificates = Certificates(self.config, self.alpn)
                server = await self._listen(certificates)
            except (OSError, ssl.SSLError) as exc:  # keep serving with the last good ones
                log.warning("TLS certificates could not be made again: %s", exc)
                continue
            old, self.server, self.certificates = self.server, server, certificates
            if old is not None:
                old.close()
            log.info("TLS contexts made again (new session ticket keys)")


class _Alpn:
    """The protocol of a TLS connection when its handshake is done: it hands the
    connection to HTTP/2 or HTTP/1.1 by the protocol ALPN chose."""

    def __init__(self, shell: Shell) -> None:
        self.shell = shell

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tls = cast(asyncio.Transport, transport)
        ssl_object = tls.get_extra_info("ssl_object")
        chosen = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        conn: ClientConnection | H2Connection
        if chosen == "h2":
            conn = H2Connection(self.shell, b"https")
        else:
            conn = ClientConnection(self.shell, b"https")
        tls.set_protocol(cast(asyncio.BaseProtocol, conn))
        conn.connection_made(tls)

    def connection_lost(self, exc: Exception | None) -> None:
        pass

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False
