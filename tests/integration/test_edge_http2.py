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

from edge.adapters.http2 import LINGER_S, H2Connection
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


async def test_a_hundred_requests_in_one_write_are_taken_in_slices_and_all_answered(
    edge: EdgeHarness,
) -> None:
    """One read holding 100 requests (the connection's whole stream limit) is taken
    REQUESTS_PER_TURN streams at a time, reading paused meanwhile: every request is
    answered, and the connection reads again afterwards."""
    client = await H2Client.open(edge.port)
    try:
        answers = []
        for _ in range(100):
            stream_id = client.conn.get_next_available_stream_id()
            answers.append(client.answers.setdefault(stream_id, Answer()))
            client.conn.send_headers(stream_id, [
                (b":method", b"GET"), (b":scheme", b"http"), (b":authority", WEB),
                (b":path", b"/")], end_stream=True)
        client.flush()  # one write
        await asyncio.wait_for(asyncio.gather(*(a.done.wait() for a in answers)), 20)
        assert {(a.status, bytes(a.body)) for a in answers} == {(200, b"hello from web-m1")}
        conns = [c for c in shell(edge).connections if isinstance(c, H2Connection)]
        assert len(conns) == 1 and not conns[0].slicing
        assert (await client.request(WEB)).status == 200
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
    client = await H2Client.open(edge.port, source="127.0.0.2")
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
    client = await H2Client.open(edge.port, source="127.0.0.2")
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


async def raw_frames(port: int, sent: bytes) -> list[hyperframe.frame.Frame]:
    """The frames the edge sends back for `sent` (bytes after the edge closes, or after
    a quiet 1 s)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(sent)
    data = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 1.0):
            data += chunk
    except TimeoutError:
        pass
    finally:
        writer.close()
    return parse_frames(data)


def opening() -> bytes:
    """The preface, our SETTINGS, and stream 1 opened by a POST whose body is to come."""
    head = hpack.Encoder().encode([(b":method", b"POST"), (b":scheme", b"http"),
                                   (b":authority", WEB), (b":path", b"/echo")])
    return (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + hyperframe.frame.SettingsFrame(0).serialize()
            + hyperframe.frame.HeadersFrame(1, data=head, flags=["END_HEADERS"]).serialize()
            + hyperframe.frame.RstStreamFrame(1, error_code=8).serialize())


async def test_data_on_a_stream_the_client_reset_is_a_stream_closed_error(
    edge: EdgeHarness,
) -> None:
    """h2spec 5.1/8: DATA after the client's own RST_STREAM is its error (STREAM_CLOSED),
    not dropped as frames in flight on a stream the edge reset would be."""
    data = hyperframe.frame.DataFrame(1, data=b"late", flags=["END_STREAM"]).serialize()
    frames = await raw_frames(edge.port, opening() + data)
    errors = [f.error_code for f in frames
              if isinstance(f, hyperframe.frame.RstStreamFrame) and f.stream_id == 1]
    errors += [f.error_code for f in frames if isinstance(f, hyperframe.frame.GoAwayFrame)]
    assert errors == [h2.errors.ErrorCodes.STREAM_CLOSED], frames


async def test_headers_on_a_stream_the_client_reset_is_a_connection_error(
    edge: EdgeHarness,
) -> None:
    """h2spec 5.1/9: HEADERS again on a stream the client reset: GOAWAY STREAM_CLOSED."""
    head = hpack.Encoder().encode([(b":method", b"GET"), (b":scheme", b"http"),
                                   (b":authority", WEB), (b":path", b"/")])
    again = hyperframe.frame.HeadersFrame(1, data=head,
                                          flags=["END_HEADERS", "END_STREAM"]).serialize()
    frames = await raw_frames(edge.port, opening() + again)
    goaways = [f for f in frames if isinstance(f, hyperframe.frame.GoAwayFrame)]
    assert [f.error_code for f in goaways] == [h2.errors.ErrorCodes.STREAM_CLOSED], frames


def parse_frames(data: bytes) -> list[hyperframe.frame.Frame]:
    found = []
    while len(data) >= 9:
        frame, length = hyperframe.frame.Frame.parse_frame_header(memoryview(data[:9]))
        frame.parse_body(memoryview(data[9:9 + length]))
        data = data[9 + length:]
        found.append(frame)
    return found


async def answered_then(port: int, follow: bytes) -> tuple[float, list[hyperframe.frame.Frame]]:
    """Open stream 1 with a POST of content-length 10 to a host no app serves, wait until
    the edge's whole answer (404) is in, then send `follow`: (seconds until the edge
    reset stream 1 after its answer, or -1, and the frames it sent for stream 1 after)."""
    head = hpack.Encoder().encode([(b":method", b"POST"), (b":scheme", b"http"),
                                   (b":authority", b"nobody.localhost"), (b":path", b"/"),
                                   (b"content-length", b"10")])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                     + hyperframe.frame.SettingsFrame(0).serialize()
                     + hyperframe.frame.HeadersFrame(1, data=head, flags=["END_HEADERS"])
                     .serialize())
        data = b""
        while not any(f.stream_id == 1 and "END_STREAM" in f.flags
                      for f in parse_frames(data)):
            data += await asyncio.wait_for(reader.read(65536), 10)
        seen = len(parse_frames(data))
        answered = time.monotonic()
        writer.write(follow)
        reset_after = -1.0
        try:
            while chunk := await asyncio.wait_for(reader.read(65536), LINGER_S + 0.6):
                data += chunk
                if reset_after < 0 and any(isinstance(f, hyperframe.frame.RstStreamFrame)
                                           for f in parse_frames(data)[seen:]):
                    reset_after = time.monotonic() - answered
        except TimeoutError:
            pass
    finally:
        writer.close()
    return reset_after, [f for f in parse_frames(data)[seen:] if f.stream_id in (0, 1)
                         and not isinstance(f, hyperframe.frame.SettingsFrame)]


def _trailers(end: bool) -> bytes:
    block = hpack.Encoder().encode([(b"x-checksum", b"0")])
    return hyperframe.frame.HeadersFrame(
        1, data=block, flags=["END_HEADERS", "END_STREAM"] if end else ["END_HEADERS"]
    ).serialize()


@pytest.mark.parametrize(("case", "follow", "error"), [
    ("8.1.2.6/1: more than its content-length",
     hyperframe.frame.DataFrame(1, data=b"x" * 20, flags=["END_STREAM"]).serialize(),
     h2.errors.ErrorCodes.PROTOCOL_ERROR),
    ("8.1.2.6: less than its content-length",
     hyperframe.frame.DataFrame(1, data=b"x" * 3, flags=["END_STREAM"]).serialize(),
     h2.errors.ErrorCodes.PROTOCOL_ERROR),
    ("8.1/1: trailers that do not end the stream", _trailers(end=False),
     h2.errors.ErrorCodes.PROTOCOL_ERROR),
    ("6.9.1/3: the stream's window past 2^31-1",
     hyperframe.frame.WindowUpdateFrame(1, window_increment=0x7FFFFFFF).serialize(),
     h2.errors.ErrorCodes.FLOW_CONTROL_ERROR),
], ids=["8.1.2.6-1-longer", "8.1.2.6-shorter", "8.1-1-trailers-open", "6.9.1-3-window"])
async def test_a_malformed_frame_after_the_answer_went_out_is_still_a_stream_error(
    edge: EdgeHarness, case: str, follow: bytes, error: int,
) -> None:
    """h2spec 8.1.2.6/1, 8.1/1 and 6.9.1/3 when the edge has answered (here 404, at once)
    before the bad frame came: the stream lingers for the rest of its request, so the
    frame still gets its stream error, not an RST_STREAM NO_ERROR sent before it came."""
    _, frames = await answered_then(edge.port, follow)
    errors = [f.error_code for f in frames if isinstance(f, hyperframe.frame.RstStreamFrame)]
    assert errors == [error], (case, frames)
    assert not any(isinstance(f, hyperframe.frame.GoAwayFrame) for f in frames), frames


async def test_an_answered_request_whose_rest_comes_right_ends_without_a_reset(
    edge: EdgeHarness,
) -> None:
    for follow in (hyperframe.frame.DataFrame(1, data=b"x" * 10, flags=["END_STREAM"])
                   .serialize(),
                   hyperframe.frame.DataFrame(1, data=b"x" * 10).serialize()
                   + _trailers(end=True)):
        _, frames = await answered_then(edge.port, follow)
        assert not any(isinstance(f, (hyperframe.frame.RstStreamFrame,
                                      hyperframe.frame.GoAwayFrame)) for f in frames), frames


async def test_an_answered_request_whose_rest_never_comes_is_reset_no_error_after_lingering(
    edge: EdgeHarness,
) -> None:
    """RFC 9113 8.1: after a complete answer the server may stop the request with
    RST_STREAM NO_ERROR: the edge does once the stream lingered LINGER_S (some DATA
    in the meantime is read and dropped)."""
    reset_after, frames = await answered_then(
        edge.port, hyperframe.frame.DataFrame(1, data=b"x" * 4).serialize())
    errors = [f.error_code for f in frames if isinstance(f, hyperframe.frame.RstStreamFrame)]
    assert errors == [h2.errors.ErrorCodes.NO_ERROR], frames
    assert reset_after >= LINGER_S * 0.9, reset_after


@pytest.mark.parametrize("preface", [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\rQ",
                                     b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n"])
async def test_a_broken_preface_gets_goaway_protocol_error_and_a_close(
    edge: EdgeHarness, preface: bytes,
) -> None:
    """h2spec 3.5/2's kind: a preface that strays after its first line is answered in
    HTTP/2 (GOAWAY PROTOCOL_ERROR, then close), not with an HTTP/1.1 400."""
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.port)
    try:
        writer.write(preface + hyperframe.frame.SettingsFrame(0).serialize())
        data = await asyncio.wait_for(reader.read(), 10)  # until the edge closes
    finally:
        writer.close()
    frame, length = hyperframe.frame.Frame.parse_frame_header(memoryview(data[:9]))
    frame.parse_body(memoryview(data[9:9 + length]))
    assert isinstance(frame, hyperframe.frame.GoAwayFrame), data[:40]
    assert frame.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR


async def test_a_request_that_is_not_a_preface_is_still_http_1s_400(edge: EdgeHarness) -> None:
    data = await exchange_raw(edge.port, b"INVALID CONNECTION PREFACE\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 400")


async def test_streams_reset_in_the_read_that_opened_them_wake_nothing_and_reach_nothing(
) -> None:
    """Rapid reset's own pattern, HEADERS and RST_STREAM in one write: requests ended by
    their head are dispatched when the read is taken whole, so these never count as
    demand (no wake of a cold app) nor reach a machine; a request left alone still does."""
    edge = await start_edge([{"name": "cold"}], FakePlacement())
    try:
        client = await H2Client.open(edge.port, source="127.0.0.5")
        for _ in range(50):
            stream_id = client.conn.get_next_available_stream_id()
            client.conn.send_headers(stream_id, [
                (b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"cold.localhost"),
                (b":path", b"/")], end_stream=True)
            client.conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        client.flush()  # one write
        await asyncio.sleep(0.5)
        assert edge.placement.wakes == []
        answer = await client.request(b"cold.localhost")
        assert answer.status == 200 and edge.placement.wakes == [1]
        await client.close()
    finally:
        await edge.close()
