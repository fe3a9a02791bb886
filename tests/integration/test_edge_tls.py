"""TLS at the edge with real sockets: certificates chosen by SNI from a directory, TLS 1.2
as the floor, ALPN, X-Forwarded-Proto, and session tickets that stop working when the
contexts rotate."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from pathlib import Path

import pytest

from edge.config import TlsConfig
from tests.support.edge_fakes import exchange_raw, start_warm_edge
from tests.support.h2client import H2Client
from thaw.localca import LocalCA

pytestmark = pytest.mark.integration


def client_context(ca: LocalCA, *, alpn: list[str] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca.cert_path))
    if alpn:
        context.set_alpn_protocols(alpn)
    return context


def handshake(port: int, context: ssl.SSLContext, name: str,
              session: ssl.SSLSession | None = None) -> tuple[dict, ssl.SSLSession | None, bool]:  # type: ignore[type-arg]
    """(peer certificate, the session, whether it was resumed) of one connection that sends
    one request and reads the answer (TLS 1.3 tickets arrive after the handshake)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=name, session=session) as tls:
        tls.sendall(f"GET / HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
        while tls.recv(65536):
            pass
        return tls.getpeercert(), tls.session, tls.session_reused


def names_of(cert: dict) -> set[str]:  # type: ignore[type-arg]
    return {value for kind, value in cert.get("subjectAltName", ()) if kind == "DNS"}


@pytest.fixture
def ca(tmp_path: Path) -> LocalCA:
    return LocalCA(tmp_path / "ca", domain="test")


async def test_the_certificate_is_chosen_by_sni_from_the_directory(
    ca: LocalCA, tmp_path: Path,
) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    for name, file in (("a.test", "a.test.pem"), ("wild.b.test", "*.b.test.pem")):
        chain, key = ca.issue(name) or (b"", b"")
        (certs / file).write_bytes(chain + key)
    edge = await start_warm_edge(domain="test", tls=TlsConfig(cert_dir=str(certs), port=0))
    try:
        port = edge.runtime.tls_port  # type: ignore[attr-defined]
        context = client_context(ca)
        cert, _, _ = await asyncio.to_thread(handshake, port, context, "a.test")
        assert names_of(cert) == {"a.test"}
        cert, _, _ = await asyncio.to_thread(handshake, port, context, "wild.b.test")
        assert names_of(cert) == {"wild.b.test"}
        # a name with no certificate of its own gets the default (the directory's first)
        loose = ssl.create_default_context(cafile=str(ca.cert_path))
        loose.check_hostname = False
        cert, _, _ = await asyncio.to_thread(handshake, port, loose, "c.test")
        assert names_of(cert) == {"wild.b.test"}  # "*.b.test.pem" sorts before "a.test.pem"
    finally:
        await edge.close()


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated")
async def test_tls_below_1_2_is_refused_and_alpn_picks_the_protocol(ca: LocalCA) -> None:
    edge = await start_warm_edge(domain="test", tls=TlsConfig(port=0, issuer=ca.issue))
    try:
        port = edge.runtime.tls_port  # type: ignore[attr-defined]
        old = client_context(ca)
        old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        old.maximum_version = ssl.TLSVersion.TLSv1_1
        with pytest.raises((ssl.SSLError, OSError)):
            await asyncio.to_thread(handshake, port, old, "web.test")
        client = await H2Client.open(port, tls=client_context(ca, alpn=["h2"]),
                                     server_hostname="web.test")
        try:
            answer = await client.request(b"web.test", b"/headers")
            assert answer.status == 200
            headers = {k.lower(): v for k, v in json.loads(answer.body)}
            assert headers["x-forwarded-proto"] == "https"
        finally:
            await client.close()
    finally:
        await edge.close()


async def test_rotation_makes_new_ticket_keys_so_old_sessions_do_not_resume(
    ca: LocalCA,
) -> None:
    edge = await start_warm_edge(domain="test",
                                 tls=TlsConfig(port=0, issuer=ca.issue, rotate_s=1.0))
    try:
        port = edge.runtime.tls_port  # type: ignore[attr-defined]
        context = client_context(ca)
        context.maximum_version = ssl.TLSVersion.TLSv1_2  # a session is ready at once
        _, session, _ = await asyncio.to_thread(handshake, port, context, "web.test")
        _, _, resumed = await asyncio.to_thread(handshake, port, context, "web.test", session)
        assert resumed  # the same keys: resumed
        await asyncio.sleep(1.5)  # one rotation
        _, _, resumed = await asyncio.to_thread(handshake, port, context, "web.test", session)
        assert not resumed  # new keys: a full handshake, and the connection still served
    finally:
        await edge.close()


def tls12(ca: LocalCA, ciphers: str) -> ssl.SSLContext:
    context = client_context(ca)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(ciphers)
    return context


async def test_tls_1_2_takes_forward_secret_aead_suites_only(ca: LocalCA) -> None:
    """No CBC suite (testssl's LUCKY13) and no static RSA key exchange: a TLS 1.2 client
    offering only those is refused; one offering ECDHE with AES-GCM or ChaCha20 is served."""
    edge = await start_warm_edge(domain="test", tls=TlsConfig(port=0, issuer=ca.issue))
    try:
        port = edge.runtime.tls_port  # type: ignore[attr-defined]
        for refused in ("ECDHE+AES+SHA1:ECDHE+AES+SHA256:ECDHE+AES+SHA384",  # CBC
                        "AES128-GCM-SHA256:AES256-GCM-SHA384"):  # static RSA
            with pytest.raises((ssl.SSLError, OSError)):
                await asyncio.to_thread(handshake, port, tls12(ca, refused), "web.test")
        for taken in ("ECDHE+AESGCM", "ECDHE+CHACHA20"):
            await asyncio.to_thread(handshake, port, tls12(ca, taken), "web.test")
    finally:
        await edge.close()


async def test_hsts_is_added_over_tls_only_and_never_twice(ca: LocalCA) -> None:
    edge = await start_warm_edge(domain="test", tls=TlsConfig(port=0, issuer=ca.issue,
                                                              hsts_max_age_s=31536000))
    try:
        port = edge.runtime.tls_port  # type: ignore[attr-defined]

        def get(path: str) -> bytes:
            context = client_context(ca)
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                    context.wrap_socket(raw, server_hostname="web.test") as tls:
                tls.sendall(f"GET {path} HTTP/1.1\r\nHost: web.test\r\nConnection: close"
                            f"\r\n\r\n".encode())
                data = b""
                while chunk := tls.recv(65536):
                    data += chunk
                return data.split(b"\r\n\r\n", 1)[0].lower()

        head = await asyncio.to_thread(get, "/")
        assert head.count(b"strict-transport-security: max-age=31536000") == 1, head
        own = await asyncio.to_thread(get, "/header?name=Strict-Transport-Security&value=max-age=5")
        assert own.count(b"strict-transport-security") == 1 and b"max-age=5" in own, own
        client = await H2Client.open(port, tls=client_context(ca, alpn=["h2"]),
                                     server_hostname="web.test")
        try:
            answer = await client.request(b"web.test", b"/")
            assert answer.headers[b"strict-transport-security"] == b"max-age=31536000"
        finally:
            await client.close()
        plain = await exchange_raw(edge.port, b"GET / HTTP/1.1\r\nHost: web.test\r\n"
                                              b"Connection: close\r\n\r\n")
        assert plain.startswith(b"HTTP/1.1 200")
        assert b"strict-transport-security" not in plain.lower()
    finally:
        await edge.close()
