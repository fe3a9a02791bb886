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
life (which would weaken forward secrecy), so the contexts are made again
every `rotate_s` — new ticket keys, and certificate files re-read — and each
connection's handshake runs with the contexts current when it was accepted
(`loop.start_tls`; a ticket of the previous keys gets a full handshake).
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
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
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
        if found is None and self.config.issuer is not None and len(self.by_name) < 10_000:
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
    """Accepts TCP connections, runs the TLS handshake with the current certificates, and
    hands the connection to HTTP/2 (ALPN h2) or HTTP/1.1."""

    def __init__(self, shell: Shell, config: TlsConfig, h2: bool) -> None:
        self.shell = shell
        self.config = config
        self.alpn = ["h2", "http/1.1"] if h2 else ["http/1.1"]
        self.certificates = Certificates(config, self.alpn)
        self.handshakes: set[asyncio.Task[None]] = set()
        self._rotator: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._rotator = self.shell.loop.call_later(self.config.rotate_s, self._rotate)

    def stop(self) -> None:
        if self._rotator is not None:
            self._rotator.cancel()
        for task in list(self.handshakes):
            task.cancel()

    def _rotate(self) -> None:
        try:
            self.certificates = Certificates(self.config, self.alpn)
            log.info("TLS contexts made again (new session ticket keys)")
        except (OSError, ssl.SSLError) as exc:  # keep serving with the last good ones
            log.warning("TLS certificates could not be read again: %s", exc)
        self._rotator = self.shell.loop.call_later(self.config.rotate_s, self._rotate)

    def protocol(self) -> asyncio.Protocol:
        return cast(asyncio.Protocol, _Handshake(self))

    async def handshake(self, transport: asyncio.Transport) -> None:
        loop = self.shell.loop
        early = _Early()
        try:
            tls = await loop.start_tls(
                transport, cast(asyncio.BaseProtocol, early), self.certificates.default,
                server_side=True, ssl_handshake_timeout=self.shell.config.header_timeout_s)
        except (TimeoutError, OSError, ssl.SSLError, ConnectionError) as exc:
            log.info("TLS handshake failed: %r", exc)
            transport.abort()
            return
        if tls is None or early.lost:
            log.info("TLS connection lost during its handshake")
            transport.abort()
            return
        ssl_object = tls.get_extra_info("ssl_object")
        chosen = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        conn: ClientConnection | H2Connection
        if chosen == "h2":
            conn = H2Connection(self.shell, b"https")
        else:
            conn = ClientConnection(self.shell, b"https")
        tls.set_protocol(cast(asyncio.BaseProtocol, conn))
        conn.connection_made(tls)
        for data in early.data:  # what came with the handshake's last flight
            conn.data_received(data)


class _Handshake:
    """The protocol of a TCP connection until its TLS handshake begins: reading pauses
    (start_tls resumes it), so the ClientHello waits for the handshake."""

    def __init__(self, door: TlsDoor) -> None:
        self.door = door

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tcp = cast(asyncio.Transport, transport)
        tcp.pause_reading()
        task = self.door.shell.loop.create_task(self.door.handshake(tcp))
        self.door.handshakes.add(task)
        task.add_done_callback(self.door.handshakes.discard)

    def connection_lost(self, exc: Exception | None) -> None:
        pass

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False


class _Early:
    """The protocol on the TLS side until the handshake's end is seen: keeps what the
    client sent with its last flight (an h2 preface often comes with it)."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True

    def data_received(self, data: bytes) -> None:
        self.data.append(data)

    def eof_received(self) -> bool:
        return False

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass
