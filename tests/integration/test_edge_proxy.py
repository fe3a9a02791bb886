"""The edge's data path with real sockets and a real backend process: routing, framing
rejections, slowloris, streaming large bodies, pipelining and upstream keep-alive."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator

import pytest

from tests.support.edge_fakes import (
    EdgeHarness,
    exchange_raw,
    pattern_sha256,
    split_response,
    start_edge,
    start_warm_edge,
)
from tests.support.ports import free_port

pytestmark = pytest.mark.integration

MIB = 1 << 20


@pytest.fixture
async def edge() -> AsyncIterator[EdgeHarness]:
    harness = await start_warm_edge(header_timeout_s=0.5, idle_timeout_s=2.0)
    try:
        yield harness
    finally:
        await harness.close()


async def test_an_unknown_host_answers_404_json(edge: EdgeHarness) -> None:
    data = await exchange_raw(edge.port, b"GET / HTTP/1.1\r\nHost: nope.localhost\r\n"
                                         b"Connection: close\r\n\r\n")
    status, headers, body = split_response(data)
    assert status == 404 and headers["content-type"] == "application/json"
    assert json.loads(body) == {"error": "unknown_app", "message": "no app serves this host"}
    assert b"nope" not in body  # the Host is not echoed


async def test_an_app_is_reached_by_its_extra_host_name_with_any_port(edge: EdgeHarness) -> None:
    data = await exchange_raw(edge.port, b"GET / HTTP/1.1\r\nHost: WWW.example.test:8443\r\n"
                                         b"Connection: close\r\n\r\n")
    assert split_response(data)[2] == b"hello from web-m1"


@pytest.mark.parametrize(
    ("request_bytes", "code"),
    [
        (b"GET / HTTP/1.1\r\nHost: web.localhost\r\nHost: web.localhost\r\n\r\n", "duplicate_host"),
        (b"GET / HTTP/1.1\r\n\r\n", "missing_host"),
        (b"GET http://web.localhost/ HTTP/1.1\r\n\r\n", "missing_host"),
        (b"GET http://other.localhost/ HTTP/1.1\r\nHost: web.localhost\r\n\r\n",
         "conflicting_host"),
        (b"POST / HTTP/1.1\r\nHost: web.localhost\r\nContent-Length: 5\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n", None),
        (b"POST / HTTP/1.1\r\nHost: web.localhost\r\nContent-Length: 5\r\n"
         b"Content-Length: 6\r\n\r\nhello", None),
        (b"POST / HTTP/1.1\r\nHost: web.localhost\r\nTransfer-Encoding: gzip\r\n\r\n",
         "bad_framing"),
        (b"POST / HTTP/1.0\r\nHost: web.localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
         b"5\r\nhello\r\n0\r\n\r\n", "bad_framing"),
        (b"GET / HTTP/1.1\r\nHost: web.localhost\r\nBad Header\r\n\r\n", "bad_request"),
        (b"POST / HTTP/1.1\r\nHost: web.localhost\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
         None),  # llhttp refuses these two itself (bad_request); framing's rules agree
        (b"POST / HTTP/1.1\r\nHost: web.localhost\r\nTransfer-Encoding: chunked\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", None),
        (b"GET ftp://web.localhost/abs HTTP/1.1\r\nHost: web.localhost\r\n\r\n", "bad_target"),
        (b"GET * HTTP/1.1\r\nHost: web.localhost\r\n\r\n", "bad_target"),
        (b"GET x HTTP/1.1\r\nHost: web.localhost\r\n\r\n", None),  # llhttp refuses it
        (b"GET / HTTP/1.1\r\nHost: web.localhost:1@evil.example\r\n\r\n", "bad_host"),
        (b"GET / HTTP/1.1\r\nHost: web.localhost:<script>\r\n\r\n", "bad_host"),
        (b"GET / HTTP/1.1\r\nHost: web.localhost:80 evil.example\r\n\r\n", "bad_host"),
        (b"GET http://web.localhost:1@evil.example/ HTTP/1.1\r\nHost: web.localhost\r\n\r\n",
         "bad_host"),
    ],
    ids=["duplicate-host", "missing-host", "absolute-form-no-host", "conflicting-authority",
         "cl-and-te", "differing-cl", "te-not-chunked", "http10-te", "garbage-header",
         "te-chunked-not-last", "te-chunked-twice", "ftp-target", "star-not-options",
         "bare-word-target", "host-userinfo-port", "host-script-port", "host-space",
         "absolute-userinfo"],
)
async def test_ambiguous_or_malformed_requests_answer_400_and_close(
    edge: EdgeHarness, request_bytes: bytes, code: str | None
) -> None:
    data = await exchange_raw(edge.port, request_bytes)  # reads until EOF: the edge closed
    status, headers, body = split_response(data)
    assert status == 400 and headers["connection"] == "close"
    if code is not None:
        assert json.loads(body)["error"] == code
    assert data.count(b"HTTP/1.1 ") == 1  # nothing after the rejection is answered


@pytest.mark.parametrize(
    "codings",
    [b"Transfer-Encoding: gzip, chunked\r\n",
     b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n"],
    ids=["one-header", "two-headers"],
)
async def test_a_transfer_coding_other_than_chunked_answers_501_and_close(
    edge: EdgeHarness, codings: bytes
) -> None:
    data = await exchange_raw(
        edge.port, b"POST /sha256 HTTP/1.1\r\nHost: web.localhost\r\n" + codings
        + b"\r\n5\r\nhello\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: web.localhost\r\n\r\n",
    )
    status, headers, body = split_response(data)
    assert status == 501 and headers["connection"] == "close"
    assert json.loads(body) == {"error": "transfer_coding_not_supported",
                                "message": "only the chunked transfer coding is supported"}
    assert data.count(b"HTTP/1.1 ") == 1


@pytest.mark.parametrize("coding", [b"chunked", b"Chunked", b"CHUNKED"])
async def test_a_chunked_body_in_any_case_is_forwarded(edge: EdgeHarness, coding: bytes) -> None:
    data = await exchange_raw(
        edge.port, b"POST /sha256 HTTP/1.1\r\nHost: web.localhost\r\nConnection: close\r\n"
        b"Transfer-Encoding: " + coding + b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    status, _, body = split_response(data)
    assert status == 200 and body.decode() == hashlib.sha256(b"hello").hexdigest()


async def _recording_machine(heads: list[bytes]) -> tuple[asyncio.Server, int]:
    """A machine that keeps each request head it is sent and answers 200 `seen`."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                heads.append(head)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nseen")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    port = free_port()
    return await asyncio.start_server(serve, "127.0.0.1", port), port


@pytest.fixture
async def recorded() -> AsyncIterator[tuple[EdgeHarness, list[bytes]]]:
    """An edge serving app `web` from a machine that records what reaches it."""
    heads: list[bytes] = []
    server, port = await _recording_machine(heads)
    harness = await start_edge([{"name": "web"}])
    try:
        await harness.add_machine("web", "web-rec", port, start=False)
        deadline = time.monotonic() + 5
        while not (await harness.state())["apps"]["web"]["machines"]:  # type: ignore[index]
            assert time.monotonic() < deadline, "the machine never reached the view"
            await asyncio.sleep(0.02)
        yield harness, heads
    finally:
        await harness.close()
        server.close()


async def test_options_star_reaches_the_machine_as_options_star(
    recorded: tuple[EdgeHarness, list[bytes]],
) -> None:
    edge, heads = recorded
    data = await exchange_raw(edge.port, b"OPTIONS * HTTP/1.1\r\nHost: web.localhost\r\n"
                                         b"Connection: close\r\n\r\n")
    assert split_response(data)[0] == 200 and split_response(data)[2] == b"seen"
    assert [head.split(b"\r\n", 1)[0] for head in heads] == [b"OPTIONS * HTTP/1.1"]


@pytest.mark.parametrize(
    "request_bytes",
    [b"GET / HTTP/1.1\r\nHost: web.localhost:1@evil.example\r\n\r\n",
     b"GET /reset HTTP/1.1\r\nHost: web.localhost:80 evil.example\r\n\r\n",
     b"GET ftp://web.localhost/abs HTTP/1.1\r\nHost: web.localhost\r\n\r\n",
     b"POST / HTTP/1.1\r\nHost: web.localhost\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
     b"0\r\n\r\n"],
    ids=["host-userinfo", "host-space", "ftp-target", "gzip-chunked"],
)
async def test_a_refused_head_never_reaches_the_machine(
    recorded: tuple[EdgeHarness, list[bytes]], request_bytes: bytes
) -> None:
    edge, heads = recorded
    data = await exchange_raw(edge.port, request_bytes)
    assert split_response(data)[0] in (400, 501)
    data = await exchange_raw(edge.port, b"GET /after HTTP/1.1\r\nHost: web.localhost\r\n"
                                         b"Connection: close\r\n\r\n")
    assert split_response(data)[0] == 200
    assert [head.split(b"\r\n", 1)[0] for head in heads] == [b"GET /after HTTP/1.1"]


async def test_an_absolute_form_http_1_0_request_without_host_is_served(
    edge: EdgeHarness,
) -> None:
    data = await exchange_raw(edge.port, b"GET http://web.localhost/ HTTP/1.0\r\n\r\n")
    assert split_response(data)[2] == b"hello from web-m1"


async def test_header_names_with_an_underscore_never_reach_the_machine(edge: EdgeHarness) -> None:
    data = await exchange_raw(
        edge.port,
        b"GET /headers HTTP/1.1\r\nHost: web.localhost\r\nX_Api_Key: stolen\r\n"
        b"X-Api-Key: mine\r\nTransfer_Encoding: chunked\r\nX_Forwarded_For: 6.6.6.6\r\n"
        b"Connection: close\r\n\r\n",
    )
    status, _, body = split_response(data)
    names = [name for name, _ in json.loads(body)]
    assert status == 200 and not [name for name in names if "_" in name]
    assert dict(json.loads(body))["X-Api-Key"] == "mine"


async def test_header_names_with_an_underscore_answer_400_and_close_when_so_configured() -> None:
    harness = await start_warm_edge(underscore_headers="reject")
    try:
        data = await exchange_raw(
            harness.port, b"GET / HTTP/1.1\r\nHost: web.localhost\r\nX_Api_Key: k\r\n\r\n"
            b"GET / HTTP/1.1\r\nHost: web.localhost\r\n\r\n",
        )
        status, headers, body = split_response(data)
        assert status == 400 and headers["connection"] == "close"
        assert json.loads(body)["error"] == "bad_header"
        assert data.count(b"HTTP/1.1 ") == 1
    finally:
        await harness.close()


async def test_an_upgrade_to_anything_but_websocket_answers_501(edge: EdgeHarness) -> None:
    data = await exchange_raw(edge.port, b"GET / HTTP/1.1\r\nHost: web.localhost\r\n"
                              b"Connection: Upgrade\r\nUpgrade: irc\r\n\r\n")
    status, _, body = split_response(data)
    assert status == 501 and json.loads(body)["error"] == "upgrade_not_supported"


async def test_too_many_headers_answer_431(edge: EdgeHarness) -> None:
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(150))
    data = await exchange_raw(edge.port, b"GET / HTTP/1.1\r\nHost: web.localhost\r\n" + many
                              + b"\r\n")
    assert split_response(data)[0] == 431


async def test_a_slowloris_connection_is_closed_after_the_header_timeout(
    edge: EdgeHarness,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.port)
    began = time.monotonic()
    writer.write(b"GET / HTTP/1.1\r\nHost: web.localhost\r\nX-Slow: ")
    data = b""
    while time.monotonic() - began < 3:  # one byte every 100 ms, never ending the head
        try:
            piece = await asyncio.wait_for(reader.read(65536), 0.1)
        except TimeoutError:
            writer.write(b"a")
            continue
        except ConnectionError:
            break
        if not piece:
            break
        data += piece
    writer.close()
    assert time.monotonic() - began < 2
    assert split_response(data)[0] == 408


async def test_an_idle_keep_alive_connection_is_closed_silently(edge: EdgeHarness) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.port)
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert data == b""


async def test_an_idle_kept_alive_connection_parks_then_serves_again_then_closes(
    edge: EdgeHarness,
) -> None:
    """Idle a watchdog period, a connection gives up its parser, reader and timer (the
    shell's sweep watches it); its next request makes new ones; idle long enough, the
    sweep closes it; a slow head after parking still meets the header timeout."""
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.port)
    for _ in range(3):
        writer.write(b"GET / HTTP/1.1\r\nHost: web.localhost\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        assert head.startswith(b"HTTP/1.1 200") and await reader.readexactly(length)
        deadline = time.monotonic() + 5
        while len(edge.shell.parking) != 1:
            assert time.monotonic() < deadline, "the idle connection never parked"
            await asyncio.sleep(0.02)
    started = time.monotonic()
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the sweep
    assert time.monotonic() - started >= 1.0  # not before it was idle long (2 s)
    writer.close()
    assert len(edge.shell.parking) == 0
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.port)
    writer.write(b"GET / HTTP/1.1\r\nHost: web.localhost\r\n\r\n")
    await asyncio.wait_for(reader.readuntil(b"hello from web-m1"), 5)
    deadline = time.monotonic() + 5
    while len(edge.shell.parking) != 1:
        assert time.monotonic() < deadline, "the idle connection never parked"
        await asyncio.sleep(0.02)
    writer.write(b"GET / HTTP/1.1\r\nHost: web")  # a head that never ends
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert data.startswith(b"HTTP/1.1 408")


async def test_a_10_mib_chunked_request_body_passes_through_intact(edge: EdgeHarness) -> None:
    payload = bytes(range(256)) * (10 * MIB // 256)
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.port)
    writer.write(b"POST /sha256 HTTP/1.1\r\nHost: web.localhost\r\nConnection: close\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    for offset in range(0, len(payload), 300_000):
        piece = payload[offset:offset + 300_000]
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    status, _, body = split_response(data)
    assert status == 200 and body.decode() == hashlib.sha256(payload).hexdigest()


async def test_a_10_mib_request_body_with_content_length_passes_through_intact(
    edge: EdgeHarness,
) -> None:
    payload = bytes(reversed(range(256))) * (10 * MIB // 256)
    data = await exchange_raw(
        edge.port, b"POST /sha256 HTTP/1.1\r\nHost: web.localhost\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n" % len(payload) + payload, timeout_s=30,
    )
    assert split_response(data)[2].decode() == hashlib.sha256(payload).hexdigest()


async def test_a_10_mib_streamed_response_reaches_a_slow_reader_intact(edge: EdgeHarness) -> None:
    size = 10 * MIB
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.port, limit=1 << 16)
    writer.write(b"GET /stream?bytes=%d HTTP/1.1\r\nHost: web.localhost\r\n"
                 b"Connection: close\r\n\r\n" % size)
    head = await reader.readuntil(b"\r\n\r\n")
    assert b"chunked" in head.lower()
    digest, received = hashlib.sha256(), 0
    while True:
        size_line = await reader.readline()
        length = int(size_line.strip(), 16)
        if length == 0:
            break
        chunk = await reader.readexactly(length)
        await reader.readexactly(2)
        digest.update(chunk)
        received += length
        if received < 2 * MIB:
            await asyncio.sleep(0.005)  # a slow start: the edge must pause the machine
    writer.close()
    assert received == size and digest.hexdigest() == pattern_sha256(size)


async def test_pipelined_requests_are_answered_in_order(edge: EdgeHarness) -> None:
    requests = b"".join(
        b"GET /sleep?ms=%d HTTP/1.1\r\nHost: web.localhost\r\nX-Request-Id: r%d\r\n\r\n"
        % (ms, i) for i, ms in enumerate([50, 0, 20])
    ) + b"GET /headers HTTP/1.1\r\nHost: web.localhost\r\nConnection: close\r\n\r\n"
    data = await exchange_raw(edge.port, requests)
    assert data.count(b"HTTP/1.1 200") == 4
    bodies = [part.split(b"\r\n\r\n", 1)[1] for part in data.split(b"HTTP/1.1 200")[1:]]
    assert [b.startswith(b"slept") for b in bodies] == [True, True, True, False]
    assert bodies[3].startswith(b"[")


async def test_sequential_requests_reuse_one_upstream_connection(edge: EdgeHarness) -> None:
    async def accepts() -> int:
        data = await exchange_raw(edge.port, b"GET /accepts HTTP/1.1\r\nHost: web.localhost\r\n"
                                             b"Connection: close\r\n\r\n")
        return int(split_response(data)[2])

    before = await accepts()
    for _ in range(20):
        await exchange_raw(edge.port, b"GET / HTTP/1.1\r\nHost: web.localhost\r\n"
                                      b"Connection: close\r\n\r\n")
    assert await accepts() == before


SAYS_WHO = (b"X-Forwarded-For: 10.0.0.1\r\nX-Real-IP: 10.9.9.9\r\nForwarded: for=10.8.8.8\r\n"
            b"X-Forwarded-Proto: https\r\nX-Forwarded-Host: evil.test\r\n"
            b"Proxy-Authorization: Basic c2VjcmV0\r\n")


async def test_forwarded_headers_are_the_edges_own_and_internal_ones_stripped(
    edge: EdgeHarness,
) -> None:
    """From a peer that is not a trusted proxy (none is, by default), nothing the client
    says about itself or its proxy reaches the machine."""
    data = await exchange_raw(
        edge.port,
        b"GET /headers HTTP/1.1\r\nHost: web.localhost\r\n" + SAYS_WHO +
        b"X-Thaw-Machine: evil\r\nX-Request-Id: abc-123\r\nConnection: close, X-Drop\r\n"
        b"X-Drop: 1\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nX-Keep: yes\r\n\r\n",
    )
    pairs = [(k.lower(), v) for k, v in json.loads(split_response(data)[2])]
    headers = dict(pairs)
    assert headers["x-forwarded-for"] == "127.0.0.1"
    assert headers["x-real-ip"] == "127.0.0.1"
    assert headers["x-forwarded-proto"] == "http"
    assert headers["x-forwarded-host"] == "web.localhost"
    assert headers["x-request-id"] == "abc-123" and headers["x-keep"] == "yes"
    for dropped in ("x-thaw-machine", "x-drop", "keep-alive", "te", "via", "forwarded",
                    "proxy-authorization"):
        assert dropped not in headers
    names = [k for k, _ in pairs]  # each set once, never beside the client's
    assert all(names.count(n) == 1 for n in ("x-forwarded-for", "x-real-ip",
                                             "x-forwarded-proto", "x-forwarded-host"))


async def test_a_trusted_proxys_chain_is_kept_and_names_the_client() -> None:
    """Behind a trusted proxy (here loopback), its X-Forwarded-For is kept with the peer
    appended, X-Real-IP is the right-most address no trusted proxy holds, and the scheme
    and host it was asked for are believed (the right-most item: what the nearest proxy
    said) when they are a scheme and a host; its credentials never reach the machine."""
    harness = await start_warm_edge(trusted_proxies=("127.0.0.0/8", "10.0.0.0/8"))

    async def told(says: bytes) -> dict[str, str]:
        data = await exchange_raw(
            harness.port,
            b"GET /headers HTTP/1.1\r\nHost: web.localhost\r\nConnection: close\r\n" + says
            + b"\r\n")
        pairs = [(k.lower(), v) for k, v in json.loads(split_response(data)[2])]
        names = [k for k, _ in pairs]
        assert all(names.count(n) == 1 for n in ("x-forwarded-for", "x-real-ip",
                                                 "x-forwarded-proto", "x-forwarded-host"))
        return dict(pairs)

    try:
        headers = await told(
            b"X-Forwarded-For: 198.51.100.7, 10.1.2.3\r\nX-Real-IP: 10.9.9.9\r\n"
            b"X-Forwarded-Proto: http, HTTPS\r\nX-Forwarded-Host: www.example.com:8443\r\n"
            b"Forwarded: for=10.8.8.8\r\nProxy-Authorization: Basic c2VjcmV0\r\n")
        assert headers["x-forwarded-for"] == "198.51.100.7, 10.1.2.3, 127.0.0.1"
        assert headers["x-real-ip"] == "198.51.100.7"
        assert headers["x-forwarded-proto"] == "https"
        assert headers["x-forwarded-host"] == "www.example.com:8443"
        assert "proxy-authorization" not in headers and "forwarded" not in headers
        # what is no scheme or no host is not passed on: the edge's own are
        headers = await told(b"X-Forwarded-Proto: gopher\r\n"
                             b"X-Forwarded-Host: a b@evil.test\r\n")
        assert headers["x-forwarded-proto"] == "http"
        assert headers["x-forwarded-host"] == "web.localhost"
    finally:
        await harness.close()


async def test_http_1_0_is_answered_and_closed(edge: EdgeHarness) -> None:
    data = await exchange_raw(edge.port, b"GET /stream?bytes=1000 HTTP/1.0\r\n"
                                         b"Host: web.localhost\r\n\r\n")
    status, headers, body = split_response(data)
    assert status == 200 and len(body) == 1000 and "transfer-encoding" not in headers


async def test_http_1_0_keep_alive_is_kept_and_said_then_a_plain_1_0_request_closes(
    edge: EdgeHarness,
) -> None:
    data = await exchange_raw(
        edge.port,
        b"GET / HTTP/1.0\r\nHost: web.localhost\r\nConnection: keep-alive\r\n\r\n"
        b"GET / HTTP/1.0\r\nHost: web.localhost\r\n\r\n",
    )
    first, second = data.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert b"Connection: keep-alive\r\n" in first and first.endswith(b"hello from web-m1")
    assert b"Connection: close\r\n" in second and second.endswith(b"hello from web-m1")


@pytest.mark.parametrize("version", [b"2.0", b"0.9"])
async def test_http_versions_other_than_1_0_and_1_1_answer_505_and_close(
    edge: EdgeHarness, version: bytes
) -> None:
    data = await exchange_raw(edge.port, b"GET / HTTP/" + version + b"\r\n"
                                         b"Host: web.localhost\r\n\r\n")
    status, headers, body = split_response(data)
    assert status == 505 and headers["connection"] == "close"
    assert json.loads(body)["error"] == "version_not_supported"


async def test_a_head_request_keeps_the_connection_usable(edge: EdgeHarness) -> None:
    data = await exchange_raw(
        edge.port,
        b"HEAD / HTTP/1.1\r\nHost: web.localhost\r\n\r\n"
        b"GET / HTTP/1.1\r\nHost: web.localhost\r\nConnection: close\r\n\r\n",
    )
    first, _, second = data.partition(b"\r\n\r\n")
    assert b"Content-Length: 11" in first
    assert second.startswith(b"HTTP/1.1 200") and second.endswith(b"hello from web-m1")


async def test_after_a_slowly_read_stream_the_connections_serve_the_next_request(
    edge: EdgeHarness,
) -> None:
    size = 4 * MIB
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.port, limit=1 << 16)
    writer.write(b"GET /stream?bytes=%d HTTP/1.1\r\nHost: web.localhost\r\n\r\n" % size)
    await reader.readuntil(b"\r\n\r\n")
    received = 0
    while length := int((await reader.readline()).strip(), 16):
        received += len(await reader.readexactly(length + 2)) - 2
        await asyncio.sleep(0.002)
    await reader.readline()
    assert received == size
    for _ in range(3):  # same client connection; the upstream one goes back to the pool
        writer.write(b"GET / HTTP/1.1\r\nHost: web.localhost\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200") and b"Content-Length: 17" in head
        assert await reader.readexactly(17) == b"hello from web-m1"
    writer.close()


async def test_an_error_answer_to_a_head_request_has_no_body_and_keeps_the_connection_usable(
    edge: EdgeHarness,
) -> None:
    data = await exchange_raw(
        edge.port,
        b"HEAD / HTTP/1.1\r\nHost: nope.localhost\r\n\r\n"
        b"GET / HTTP/1.1\r\nHost: web.localhost\r\nConnection: close\r\n\r\n",
    )
    first, _, second = data.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 404") and b"Content-Length: " in first
    assert second.startswith(b"HTTP/1.1 200") and second.endswith(b"hello from web-m1")


async def test_the_admin_state_says_whether_the_native_edge_runs(edge: EdgeHarness) -> None:
    import edge.adapters.http1 as client_module
    from ground.native import state

    native = (await edge.state())["native"]
    assert native == {"on": state()[0], "why": state()[1]}  # type: ignore[comparison-overlap]
    assert native["on"] == client_module.__file__.endswith(".so")  # type: ignore[index]


async def test_a_client_that_half_closes_after_its_requests_gets_every_answer(
    edge: EdgeHarness,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.port)
    writer.write(b"GET /sleep?ms=50 HTTP/1.1\r\nHost: web.localhost\r\n\r\n"
                 b"GET / HTTP/1.1\r\nHost: web.localhost\r\n\r\n")
    await writer.drain()
    writer.write_eof()  # FIN: nothing more will come, the answers still must
    data = await asyncio.wait_for(reader.read(), timeout=10)  # until the edge closes
    writer.close()
    assert data.count(b"HTTP/1.1 200") == 2, data
    assert data.rstrip().endswith(b"hello from web-m1")


async def test_a_client_that_half_closes_inside_a_request_is_closed_without_an_answer(
    edge: EdgeHarness,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.port)
    writer.write(b"POST /sha256 HTTP/1.1\r\nHost: web.localhost\r\nContent-Length: 10\r\n\r\n"
                 b"12345")
    await writer.drain()
    writer.write_eof()
    data = await asyncio.wait_for(reader.read(), timeout=10)
    writer.close()
    assert data == b""
