"""Upgrades with real sockets: an upgrade to h2c alone (what `curl --http2` sends to an
http:// URL) is served as HTTP/1.1 and the connection goes on; any other upgrade but a
WebSocket one by GET (test_edge_websocket.py), and CONNECT, answers 501 and closes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from collections.abc import AsyncIterator

import pytest

from tests.support.edge_fakes import EdgeHarness, exchange_raw, split_response, start_warm_edge

pytestmark = pytest.mark.integration

H2C = (b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
       b"HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n")
CLOSE = b"GET / HTTP/1.1\r\nHost: web.localhost\r\nConnection: close\r\n\r\n"


@pytest.fixture
async def edge() -> AsyncIterator[EdgeHarness]:
    harness = await start_warm_edge()
    try:
        yield harness
    finally:
        await harness.close()


def answers(data: bytes) -> list[bytes]:
    """The bodies of a run of Content-Length answers, in order."""
    bodies = []
    while data:
        status, headers, rest = split_response(data)
        assert status == 200, data
        length = int(headers["content-length"])
        bodies.append(rest[:length])
        data = rest[length:]
    return bodies


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
async def test_curl_http2_to_an_http_url_is_answered_over_http_1_1(edge: EdgeHarness) -> None:
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--http2", "--max-time", "10", "-w", "\n%{http_version} %{http_code}",
        "-H", "Host: web.localhost", f"http://127.0.0.1:{edge.port}/headers",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    body, _, summary = out.rpartition(b"\n")
    assert proc.returncode == 0, err
    assert summary == b"1.1 200"
    names = {name.lower() for name, _ in json.loads(body)}
    assert not names & {"upgrade", "http2-settings", "connection"}


async def test_a_post_with_an_h2c_upgrade_brings_the_machine_its_exact_body(
    edge: EdgeHarness,
) -> None:
    payload = bytes(range(256)) * 1024
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.port)
    writer.write(b"POST /sha256 HTTP/1.1\r\nHost: web.localhost\r\n" + H2C
                 + b"Content-Length: %d\r\n\r\n" % len(payload) + payload[:1000])
    await writer.drain()
    await asyncio.sleep(0.05)  # the rest of the body arrives after the upgrade was met
    writer.write(payload[1000:] + CLOSE)
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert answers(data) == [hashlib.sha256(payload).hexdigest().encode(), b"hello from web-m1"]


async def test_a_chunked_post_with_an_h2c_upgrade_brings_the_machine_its_exact_body(
    edge: EdgeHarness,
) -> None:
    data = await exchange_raw(
        edge.port,
        b"POST /sha256 HTTP/1.1\r\nHost: web.localhost\r\n" + H2C
        + b"Transfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2;ext=1\r\nlo\r\n0\r\n"
        + b"X-Trailer: t\r\n\r\n" + CLOSE,
    )
    assert answers(data) == [hashlib.sha256(b"hello").hexdigest().encode(),
                             b"hello from web-m1"]


async def test_requests_pipelined_after_h2c_gets_are_answered_in_order_on_one_connection(
    edge: EdgeHarness,
) -> None:
    h2c_get = b"GET /sleep?ms=%d HTTP/1.1\r\nHost: web.localhost\r\n" + H2C + b"\r\n"
    data = await exchange_raw(edge.port, h2c_get % 30 + h2c_get % 0
                              + b"GET /accepts HTTP/1.1\r\nHost: web.localhost\r\n\r\n" + CLOSE)
    bodies = answers(data)
    assert bodies[:2] == [b"slept", b"slept"] and bodies[2].isdigit()
    assert bodies[3] == b"hello from web-m1"


async def test_the_connection_stays_open_for_the_next_request_after_an_h2c_get(
    edge: EdgeHarness,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.port)
    for _ in range(3):
        writer.write(b"GET / HTTP/1.1\r\nHost: web.localhost\r\n" + H2C + b"\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" not in head
        assert await reader.readexactly(17) == b"hello from web-m1"
    writer.close()


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST / HTTP/1.1\r\nHost: web.localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: web.localhost\r\nConnection: Upgrade\r\n"
        b"Upgrade: h2c, websocket\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: web.localhost\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n"
        b"Upgrade: websocket\r\n\r\n",
        b"GET / HTTP/1.0\r\nHost: web.localhost\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
        b"CONNECT web.localhost:80 HTTP/1.1\r\nHost: web.localhost:80\r\n\r\n",
    ],
    ids=["websocket-by-post", "h2c-and-websocket", "two-upgrade-headers", "http10-h2c", "connect"],
)
async def test_other_upgrades_and_connect_answer_501_and_close(
    edge: EdgeHarness, request_bytes: bytes
) -> None:
    data = await exchange_raw(edge.port, request_bytes + CLOSE)  # reads until the edge closes
    status, headers, body = split_response(data)
    assert status == 501 and headers["connection"] == "close"
    assert json.loads(body)["error"] == "upgrade_not_supported"
    assert data.count(b"HTTP/1.1 ") == 1
