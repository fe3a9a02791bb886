"""HTTP/2 at the edge with real sockets and the h2 library as the client: h2c with prior
knowledge, streams held and woken like HTTP/1.1 requests, bodies with flow control both
ways, and the floods of the 2023-2024 HTTP/2 CVEs answered with GOAWAY."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import hpack
import hyperframe.frame
import pytest

from edge.adapters.http2 import H2Connection
from edge.service import Edge
from tests.support.edge_fakes import (
    EdgeHarness,
    FakePlacement,
    exchange_raw,
    pattern_sha256,
    split_response,
    start_edge,
    start_warm_edge,
)
from tests.support.h2client import Answer, H2Client

pytestmark = pytest.mark.integration
WEB = b"web.localhost"


@pytest.fixture
async def edge() -> AsyncIterator[EdgeHarness]:
    harness = await start_warm_edge()
    try:
        yield harness
    finally:
        await harness.close()


def shell(edge: EdgeHarness) -> Edge:
    return edge.runtime.edge  # type: ignore[attr-defined,no-any-return]


async def backend_requests(edge: EdgeHarness) -> int:
    data = await exchange_raw(edge.port, b"GET /requests HTTP/1.1\r\nHost: web.localhost\r\n"
                              b"Connection: close\r\n\r\n")
    return int(split_response(data)[2])


async def test_h2c_prior_knowledge_serves_many_requests_on_one_connection(
    edge: EdgeHarness,
) -> None:
    client = await H2Client.open(edge.port)
    try:
        answers = await asyncio.gather(*(client.request(WEB) for _ in range(20)))
        assert {(a.status, bytes(a.body)) for a in answers} == {(200, b"hello from web-m1")}
        headers = await client.request(WEB, b"/headers")
        names = {name.lower() for name, _ in json.loads(headers.body)}
        assert {"host", "x-forwarded-for", "x-request-id"} <= names
        assert "connection" not in names
    finally:
        await client.close()


async def test_authority_routes_and_a_conflicting_host_header_is_a_stream_error(
    edge: EdgeHarness,
) -> None:
    client = await H2Client.open(edge.port)
    try:
        answer = await client.request(b"nope.localhost")
        assert answer.status == 404
        answer = await client.request(WEB, extra=[(b"host", b"other.localhost")])
        assert answer.reset == h2.errors.ErrorCodes.PROTOCOL_ERROR
        answer = await client.request(WEB)  # the connection goes on
        assert answer.status == 200
    finally:
        await client.close()


async def test_100_streams_to_a_cold_app_wake_exactly_the_machines_needed() -> None:
    app = {"name": "cold", "max_machines": 10,
           "concurrency": {"soft_limit": 25, "hard_limit": 30}}
    harness = await start_edge([app], FakePlacement())
    client = await H2Client.open(harness.port)
    try:
        answers = await asyncio.gather(*(client.request(b"cold.localhost", b"/sleep?ms=50")
                                         for _ in range(100)))
        assert [a.status for a in answers] == [200] * 100
        assert sum(harness.placement.wakes) == math.ceil(100 / 25)
        assert all(b"hold;dur=" in a.headers.get(b"server-timing", b"") for a in answers)
    finally:
        await client.close()
        await harness.close()


async def test_a_10_mib_upload_and_download_over_h2_keep_their_bytes(
    edge: EdgeHarness,
) -> None:
    client = await H2Client.open(edge.port)
    payload = bytes(range(256)) * (40 * 1024)  # 10 MiB
    try:
        up = await client.request(WEB, b"/sha256", b"POST", body=payload, timeout_s=60)
        assert up.status == 200 and bytes(up.body) == hashlib.sha256(payload).hexdigest().encode()
        size = 10 << 20
        down = await client.request(WEB, b"/stream?bytes=%d" % size, timeout_s=60)
        assert down.status == 200 and len(down.body) == size
        assert hashlib.sha256(down.body).hexdigest() == pattern_sha256(size)
    finally:
        await client.close()


async def test_a_slow_reading_client_does_not_make_the_edge_buffer_the_body(
    edge: EdgeHarness,
) -> None:
    client = await H2Client.open(edge.port, window=65535, auto_ack=False)
    size = 10 << 20
    try:
        stream_id = client.start(WEB, b"/stream?bytes=%d" % size)
        await asyncio.sleep(1.0)  # the client reads nothing more: its window stays shut
        conns = [c for c in shell(edge).connections if isinstance(c, H2Connection)]
        queued = sum(s.out_bytes for c in conns for s in c.streams.values())
        limit = shell(edge).config.h2_stream_buffer_bytes
        assert queued <= limit + (1 << 20), queued  # a few reads past the mark, not 10 MiB
        answer = client.answers[stream_id]
        deadline = time.monotonic() + 60
        while not answer.done.is_set():  # now read, acknowledging as we go
            got = len(answer.body)
            if got:
                client.ack(stream_id, got - getattr(client, "_acked", 0))
                client._acked = got  # type: ignore[attr-defined]
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert len(answer.body) == size
        assert hashlib.sha256(answer.body).hexdigest() == pattern_sha256(size)
    finally:
        await client.close()


async def test_rapid_resets_get_goaway_before_10000_streams_reach_the_machine(
    edge: EdgeHarness,
) -> None:
    before = await backend_requests(edge)
    client = await H2Client.open(edge.port)
    other = await H2Client.open(edge.port)
    try:
        sent = 0
        while sent < 10_000 and client.goaway is None and not client.closed.is_set():
            try:
                for _ in range(100):
                    stream_id = client.conn.get_next_available_stream_id()
                    client.conn.send_headers(stream_id, [
                        (b":method", b"GET"), (b":scheme", b"http"), (b":authority", WEB),
                        (b":path", b"/sleep?ms=100")], end_stream=True)
                    client.conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                    sent += 1
            except h2.exceptions.ProtocolError:  # the GOAWAY came in: the client is closed
                break
            client.flush()
            await asyncio.sleep(0)
        await asyncio.wait_for(client.closed.wait(), 10)
        assert client.goaway is not None
        assert client.goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        assert (await other.request(WEB)).status == 200  # another client is served
        reached = await backend_requests(edge) - before - 1
        print(f"{sent} streams opened and reset; {reached} reached the machine")
        assert reached < 10_000
    finally:
        await client.close()
        await other.close()


def frames(*items: hyperframe.frame.Frame) -> bytes:
    return b"".join(frame.serialize() for frame in items)


@pytest.mark.parametrize("flood", ["continuation", "settings", "ping", "empty_data"])
async def test_a_flood_gets_goaway_and_another_client_is_served(
    edge: EdgeHarness, flood: str,
) -> None:
    client = await H2Client.open(edge.port)
    other = await H2Client.open(edge.port)
    try:
        if flood == "continuation":
            sid = client.conn.get_next_available_stream_id()
            head = hyperframe.frame.HeadersFrame(sid, data=client.conn.encoder.encode([
                (b":method", b"GET"), (b":scheme", b"http"), (b":authority", WEB),
                (b":path", b"/")]))
            batch = frames(*(hyperframe.frame.ContinuationFrame(sid, data=b"x" * 16)
                             for _ in range(100)))
            client.writer.write(head.serialize())
        elif flood == "settings":
            batch = frames(*(hyperframe.frame.SettingsFrame(0, settings={0x3: 100})
                             for _ in range(100)))
        elif flood == "ping":
            batch = frames(*(hyperframe.frame.PingFrame(0, opaque_data=b"12345678")
                             for _ in range(100)))
        else:
            sid = client.conn.get_next_available_stream_id()
            client.conn.send_headers(sid, [(b":method", b"POST"), (b":scheme", b"http"),
                                           (b":authority", WEB), (b":path", b"/sha256")])
            client.flush()
            batch = frames(*(hyperframe.frame.DataFrame(sid, data=b"") for _ in range(100)))
        for _ in range(100):  # until the edge closes the connection
            if client.closed.is_set():
                break
            client.writer.write(batch)
            try:
                await client.writer.drain()
            except ConnectionError:
                break
            await asyncio.sleep(0.01)
        await asyncio.wait_for(client.closed.wait(), 10)
        assert client.goaway is not None
        assert client.goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        assert (await other.request(WEB)).status == 200
    finally:
        await client.close()
        await other.close()


async def test_an_empty_final_data_frame_and_trailers_end_a_chunked_body_once(
    edge: EdgeHarness,
) -> None:
    client = await H2Client.open(edge.port)
    try:
        for trailers in (False, True):
            sid = client.conn.get_next_available_stream_id()
            client.answers[sid] = Answer()
            client.conn.send_headers(sid, [(b":method", b"POST"), (b":scheme", b"http"),
                                           (b":authority", WEB), (b":path", b"/sha256")])
            client.conn.send_data(sid, b"abc")
            if trailers:
                client.conn.send_headers(sid, [(b"x-checksum", b"1")], end_stream=True)
            else:
                client.conn.send_data(sid, b"", end_stream=True)  # as Go and curl end uploads
            client.flush()
            answer = client.answers[sid]
            await asyncio.wait_for(answer.done.wait(), 10)
            assert bytes(answer.body) == hashlib.sha256(b"abc").hexdigest().encode()
        # the machine's pooled connections are still in step: plain requests still work
        answers = await asyncio.gather(*(client.request(WEB) for _ in range(5)))
        assert {a.status for a in answers} == {200}
    finally:
        await client.close()


@pytest.mark.parametrize("sent", [None, b"0123456789"])
async def test_a_body_shorter_than_its_content_length_is_a_stream_error(
    edge: EdgeHarness, sent: bytes | None,
) -> None:
    client = await H2Client.open(edge.port)
    try:
        sid = client.conn.get_next_available_stream_id()
        client.answers[sid] = Answer()
        client.conn.send_headers(sid, [(b":method", b"POST"), (b":scheme", b"http"),
                                       (b":authority", WEB), (b":path", b"/sha256"),
                                       (b"content-length", b"100")], end_stream=sent is None)
        if sent is not None:
            client.conn.send_data(sid, sent, end_stream=True)
        client.flush()
        answer = client.answers[sid]
        await asyncio.wait_for(answer.done.wait(), 10)
        # refused: a stream error, or (the h2 library's own length check, for DATA that
        # falls short) the connection ends; the machine never answers it
        assert answer.status == 0
        assert answer.reset == h2.errors.ErrorCodes.PROTOCOL_ERROR or client.closed.is_set()
    finally:
        await client.close()
    other = await H2Client.open(edge.port)  # the machine's pooled connections are in step
    try:
        answers = await asyncio.gather(*(other.request(WEB) for _ in range(5)))
        assert {a.status for a in answers} == {200}
    finally:
        await other.close()


async def test_a_path_with_a_space_is_a_stream_error(edge: EdgeHarness) -> None:
    client = await H2Client.open(edge.port)
    try:
        answer = await client.request(WEB, b"/a b HTTP/1.1\r\nX: y")
        assert answer.reset == h2.errors.ErrorCodes.PROTOCOL_ERROR
        assert (await client.request(WEB)).status == 200
    finally:
        await client.close()


async def test_trailers_pass_both_ways_and_never_become_the_next_answers_headers(
    edge: EdgeHarness,
) -> None:
    client = await H2Client.open(edge.port)
    try:
        answer = await client.request(WEB, b"/trailers")
        assert bytes(answer.body) == b"abc"
        assert answer.trailers == {b"x-checksum": b"900150983cd24fb0"}
        # request trailers reach the machine at the end of the chunked body, checked
        sid = client.conn.get_next_available_stream_id()
        client.answers[sid] = Answer()
        client.conn.send_headers(sid, [(b":method", b"POST"), (b":scheme", b"http"),
                                       (b":authority", WEB), (b":path", b"/trailers")])
        client.conn.send_data(sid, b"body")
        client.conn.send_headers(sid, [(b"x-digest", b"abc"), (b"content-length", b"9")],
                                 end_stream=True)
        client.flush()
        await asyncio.wait_for(client.answers[sid].done.wait(), 10)
        assert bytes(client.answers[sid].body) == b"x-digest: abc\r\n"
    finally:
        await client.close()
    # HTTP/1.1: the trailer follows the re-chunked body, and the machine's next answer on
    # the same pooled connection does not carry it as a header
    data = await exchange_raw(edge.port, b"GET /trailers HTTP/1.1\r\nHost: web.localhost\r\n\r\n"
                              b"GET / HTTP/1.1\r\nHost: web.localhost\r\nConnection: close\r\n\r\n")
    first, _, second = data.partition(b"0\r\nX-Checksum: 900150983cd24fb0\r\n\r\n")
    assert b"3\r\nabc\r\n" in first and second.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"x-checksum" not in second.lower()


def ws_frame(opcode: int, payload: bytes) -> bytes:
    """A client's (masked) WebSocket frame (RFC 6455 5.2)."""
    size = len(payload)
    head = bytes((0x80 | opcode,))
    if size < 126:
        head += bytes((0x80 | size,))
    elif size < 1 << 16:
        head += bytes((0x80 | 126,)) + size.to_bytes(2, "big")
    else:
        head += bytes((0x80 | 127,)) + size.to_bytes(8, "big")
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def ws_message(buffer: bytearray) -> tuple[int, bytes] | None:
    """(opcode, payload) of the server's first whole frame in `buffer`, taken out of it."""
    if len(buffer) < 2:
        return None
    size, at = buffer[1] & 0x7F, 2
    if size == 126:
        size, at = int.from_bytes(buffer[2:4], "big"), 4
    elif size == 127:
        size, at = int.from_bytes(buffer[2:10], "big"), 10
    if len(buffer) < at + size:
        return None
    opcode, payload = buffer[0] & 0x0F, bytes(buffer[at:at + size])
    del buffer[:at + size]
    return opcode, payload


async def ws_receive(answer: Answer, timeout_s: float = 20.0) -> tuple[int, bytes]:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (message := ws_message(answer.body)) is None:
        assert asyncio.get_running_loop().time() < deadline, "no WebSocket message"
        await asyncio.sleep(0.005)
    return message


async def test_a_websocket_over_h2_wakes_its_app_and_echoes_a_mebibyte() -> None:
    edge = await start_edge([{"name": "echo"}], FakePlacement(backend="hello"))
    client = await H2Client.open(edge.port)
    try:
        await asyncio.sleep(0.1)  # the edge's SETTINGS
        assert client.conn.remote_settings.enable_connect_protocol == 1
        sid = client.open_websocket(b"echo.localhost")
        answer = client.answers[sid]
        await client.send(sid, ws_frame(0x1, b"early"))  # before the tunnel opens: kept
        deadline = asyncio.get_running_loop().time() + 20
        while answer.status == 0:
            assert asyncio.get_running_loop().time() < deadline and not answer.done.is_set()
            await asyncio.sleep(0.01)
        assert answer.status == 200 and b"sec-websocket-accept" not in answer.headers
        assert edge.placement.wakes == [1]  # the CONNECT woke the app
        assert await ws_receive(answer) == (0x1, b"early")
        payload = os.urandom(1 << 20)
        await client.send(sid, ws_frame(0x2, payload))
        assert await ws_receive(answer) == (0x2, payload)
        await client.send(sid, b"", end=True)  # the client ends its side: the edge, the rest
        await asyncio.wait_for(answer.done.wait(), 10)
        state = await edge.state()
        assert state["apps"]["echo"]["in_flight"] == 0  # type: ignore[index]
        plain = await client.request(b"echo.localhost")  # the connection still serves
        assert plain.status == 200
    finally:
        await client.close()
        await edge.close()


async def test_the_machine_closing_a_websocket_over_h2_ends_the_stream() -> None:
    edge = await start_edge([{"name": "echo"}], FakePlacement(backend="hello"))
    client = await H2Client.open(edge.port)
    try:
        sid = client.open_websocket(b"echo.localhost")
        await client.send(sid, ws_frame(0x1, b"close-me"))  # the app closes with 1000
        answer = client.answers[sid]
        await asyncio.wait_for(answer.done.wait(), 20)
        assert answer.status == 200 and answer.reset in (None, 0)
        assert ws_message(answer.body) == (0x8, b"\x03\xe8")
    finally:
        await client.close()
        await edge.close()


async def test_an_idle_websocket_over_h2_is_closed() -> None:
    edge = await start_edge([{"name": "echo"}], FakePlacement(backend="hello"),
                            tunnel_idle_timeout_s=0.4)
    client = await H2Client.open(edge.port)
    try:
        sid = client.open_websocket(b"echo.localhost")
        answer = client.answers[sid]
        await client.send(sid, ws_frame(0x1, b"hi"))
        assert await ws_receive(answer) == (0x1, b"hi")
        await asyncio.wait_for(answer.done.wait(), 10)  # nothing either way: closed
        state = await edge.state()
        assert state["apps"]["echo"]["in_flight"] == 0  # type: ignore[index]
    finally:
        await client.close()
        await edge.close()


async def raw_answer(port: int, after_request: Any) -> tuple[int, bool, bool]:
    """(the :status of stream 1, whether it ended, whether a GOAWAY came) for a GET of
    /sleep?ms=400 on a raw connection, `after_request(writer)` awaited 0.1 s in (the h2
    client cannot be used: it stops reading at a GOAWAY, sent or received)."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                header_encoding=None))
    conn.initiate_connection()
    conn.send_headers(1, [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", WEB),
                          (b":path", b"/sleep?ms=400")], end_stream=True)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(conn.data_to_send())
    await asyncio.sleep(0.1)
    await after_request(writer)
    data = b""
    while chunk := await asyncio.wait_for(reader.read(65536), 10):
        data += chunk
    writer.close()
    status, ended, goaway = 0, False, False
    while len(data) >= 9:
        frame, length = hyperframe.frame.Frame.parse_frame_header(memoryview(data[:9]))
        frame.parse_body(memoryview(data[9:9 + length]))
        data = data[9 + length:]
        if isinstance(frame, hyperframe.frame.GoAwayFrame):
            goaway = True
        elif frame.stream_id == 1 and isinstance(frame, hyperframe.frame.HeadersFrame):
            status = int(dict(hpack.Decoder().decode(frame.data, raw=True))[b":status"])
        if frame.stream_id == 1 and "END_STREAM" in frame.flags:
            ended = True
    return status, ended, goaway


async def test_an_answer_in_flight_when_the_client_sends_goaway_still_arrives(
    edge: EdgeHarness,
) -> None:
    async def goaway(writer: asyncio.StreamWriter) -> None:
        writer.write(hyperframe.frame.GoAwayFrame(0, last_stream_id=0).serialize())

    assert await raw_answer(edge.port, goaway) == (200, True, False)


async def test_a_stopping_edge_finishes_the_streams_it_accepted() -> None:
    edge = await start_warm_edge()
    stopping: list[asyncio.Task[None]] = []

    async def stop(writer: asyncio.StreamWriter) -> None:  # GOAWAY, then the grace period
        stopping.append(asyncio.create_task(edge.runtime.stop()))  # type: ignore[attr-defined]

    try:
        assert await raw_answer(edge.port, stop) == (200, True, True)
        await stopping[0]
    finally:
        await edge.close()


@pytest.mark.parametrize("cut", [1, 3, 10, 17, 18, 23])
async def test_a_preface_split_across_reads_is_still_http2(edge: EdgeHarness, cut: int) -> None:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                header_encoding=None))
    conn.initiate_connection()
    conn.send_headers(1, [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", WEB),
                          (b":path", b"/")], end_stream=True)
    data = conn.data_to_send()
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.port)
    try:
        writer.write(data[:cut])
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(data[cut:])
        ended = False
        while not ended:
            chunk = await asyncio.wait_for(reader.read(65536), 10)
            assert chunk and not chunk.startswith(b"HTTP/1.1"), chunk[:40]
            events = conn.receive_data(chunk)
            ended = any(isinstance(e, h2.events.StreamEnded) for e in events)
            writer.write(conn.data_to_send())
    finally:
        writer.close()
