"""An h2c app's machine that misbehaves, or shuts down, in ways a real gRPC server does
only at the worst moment (tests/support/h2machine.py: raw frames). What the edge must
do: let a graceful GOAWAY's streams finish; reset one malformed answer's stream, not
the connection and its other calls; never pass on DATA beyond a content-length; send a
refused request again, body and all (not when the body outgrew what the edge keeps);
cancel a client's stream after the machine's GOAWAY."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.support.edge_fakes import EdgeHarness, exchange_raw, split_response, start_edge
from tests.support.h2machine import (
    CANCEL,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    Behaviour,
    MachineConn,
    ScriptedMachine,
)

pytestmark = pytest.mark.integration

APP: dict[str, object] = {"name": "rpc", "protocol": "h2c"}
OK = [(b":status", b"200"), (b"content-type", b"text/plain")]


def answer(conn: MachineConn, sid: int, body: bytes) -> None:
    conn.headers(sid, [*OK, (b"content-length", b"%d" % len(body))])
    conn.data(sid, body, end_stream=True)


def get(path: str) -> bytes:
    return (f"GET {path} HTTP/1.1\r\nHost: rpc.test\r\nConnection: close\r\n\r\n").encode()


MakeEdge = Callable[..., Awaitable[tuple[EdgeHarness, ScriptedMachine]]]


@pytest.fixture
async def machine_edge() -> AsyncIterator[MakeEdge]:
    made: list[tuple[EdgeHarness, ScriptedMachine]] = []

    async def make(behave: Behaviour, **config: int) -> tuple[EdgeHarness, ScriptedMachine]:
        machine = ScriptedMachine(behave)
        port = await machine.start()
        edge = await start_edge([APP], None, None, None, domain="test", **config)
        made.append((edge, machine))
        await edge.add_machine("rpc", "rpc-h2", port, start=False)
        deadline = time.monotonic() + 5
        while not (await edge.state())["apps"]["rpc"]["machines"]:  # type: ignore[index]
            assert time.monotonic() < deadline, "the machine never reached the view"
            await asyncio.sleep(0.02)
        return edge, machine

    yield make
    for edge, machine in made:
        await edge.close()
        await machine.close()


async def in_flight_drains(edge: EdgeHarness) -> None:
    deadline = time.monotonic() + 5
    while (await edge.state())["apps"]["rpc"]["in_flight"]:  # type: ignore[index]
        assert time.monotonic() < deadline, "in_flight never came back to 0"
        await asyncio.sleep(0.02)


async def test_a_graceful_goaway_lets_the_call_it_kept_answer(machine_edge: MakeEdge) -> None:
    async def behave(machine: ScriptedMachine, conn: MachineConn, sid: int,
                     headers: dict[bytes, bytes]) -> None:
        if headers[b":path"] == b"/first":
            conn.goaway(sid)  # shutting down: this stream is kept, no new ones
            await asyncio.sleep(0.2)
            answer(conn, sid, b"kept-answer")
            await asyncio.sleep(0.1)
            conn.close()
        else:
            answer(conn, sid, b"second")

    edge, machine = await machine_edge(behave)
    status, _, body = split_response(await exchange_raw(edge.port, get("/first")))
    assert (status, body) == (200, b"kept-answer")
    status, _, body = split_response(await exchange_raw(edge.port, get("/second")))
    assert (status, body) == (200, b"second")
    assert machine.connections == 2  # the second call on a new connection
    await in_flight_drains(edge)


async def test_a_malformed_answer_resets_its_stream_alone(machine_edge: MakeEdge) -> None:
    async def behave(machine: ScriptedMachine, conn: MachineConn, sid: int,
                     headers: dict[bytes, bytes]) -> None:
        path = headers[b":path"]
        if path == b"/slow":
            await asyncio.sleep(0.4)
            answer(conn, sid, b"slow-but-fine")
        elif path == b"/split":  # a value that would split an HTTP/1.1 head
            conn.headers(sid, [(b":status", b"200"), (b"x-evil", b"a\r\nset-cookie: s=1")],
                         end_stream=True)
        else:
            conn.headers(sid, [(b":status", b"200"), (b"X-Upper", b"1")], end_stream=True)

    edge, machine = await machine_edge(behave)
    slow = asyncio.ensure_future(exchange_raw(edge.port, get("/slow")))
    await asyncio.sleep(0.1)
    bad = split_response(await exchange_raw(edge.port, get("/upper")))
    split = await exchange_raw(edge.port, get("/split"))
    assert bad[0] == 502 and split_response(split)[0] == 502
    assert b"set-cookie" not in split.lower() and b"127.0.0.1" not in split
    status, _, body = split_response(await slow)
    assert (status, body) == (200, b"slow-but-fine")
    assert machine.connections == 1
    assert sorted(code for _, code in machine.resets) == [PROTOCOL_ERROR, PROTOCOL_ERROR]
    await in_flight_drains(edge)


async def test_data_beyond_a_content_length_is_never_passed_on(machine_edge: MakeEdge) -> None:
    async def behave(machine: ScriptedMachine, conn: MachineConn, sid: int,
                     headers: dict[bytes, bytes]) -> None:
        if headers[b":path"] == b"/long":
            conn.headers(sid, [(b":status", b"200"), (b"content-length", b"5")])
            conn.data(sid, b"12345HTTP/1.1 200 OK\r\n\r\nsmuggled", end_stream=True)
        else:
            answer(conn, sid, b"after")

    edge, machine = await machine_edge(behave)
    data = await exchange_raw(edge.port, get("/long"))
    assert b"smuggled" not in data and b"12345" not in data
    status, _, body = split_response(await exchange_raw(edge.port, get("/after")))
    assert (status, body) == (200, b"after")
    assert machine.connections == 1 and (1, PROTOCOL_ERROR) in machine.resets
    await in_flight_drains(edge)


async def test_a_refused_stream_is_sent_again(machine_edge: MakeEdge) -> None:
    async def behave(machine: ScriptedMachine, conn: MachineConn, sid: int,
                     headers: dict[bytes, bytes]) -> None:
        if len(machine.seen_streams) == 1:
            conn.reset(sid, REFUSED_STREAM)  # at its concurrency: never processed
        else:
            answer(conn, sid, b"second-try")

    edge, machine = await machine_edge(behave)
    status, _, body = split_response(await exchange_raw(edge.port, get("/again")))
    assert (status, body) == (200, b"second-try")
    assert machine.seen_streams == [1, 3] and machine.connections == 1
    await in_flight_drains(edge)


async def test_a_clients_cancel_after_the_machines_goaway_resets_its_stream(
        machine_edge: MakeEdge) -> None:
    async def behave(machine: ScriptedMachine, conn: MachineConn, sid: int,
                     headers: dict[bytes, bytes]) -> None:
        conn.goaway(sid)  # the stream is kept, and then never answered

    edge, machine = await machine_edge(behave)
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.port)
    writer.write(get("/hang"))
    deadline = time.monotonic() + 5
    while not machine.seen_streams:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)  # the GOAWAY reached the edge
    # the client gives up with a reset (a FIN alone is a half-close: the edge answers it)
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))
    writer.transport.abort()
    deadline = time.monotonic() + 5
    while (1, CANCEL) not in machine.resets:
        assert time.monotonic() < deadline, f"no CANCEL: {machine.resets}"
        await asyncio.sleep(0.02)
    await in_flight_drains(edge)
    del reader


def post(path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: rpc.test\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


async def echo_digest(conn: MachineConn, sid: int) -> None:
    """Answer with the sha256 of the stream's whole request body."""
    answer(conn, sid, hashlib.sha256(await conn.body(sid)).hexdigest().encode())


BODY = bytes(range(256)) * 200  # 51,200 bytes, under the edge's default body buffer


async def test_a_refused_call_with_a_body_is_sent_again_whole(machine_edge: MakeEdge) -> None:
    async def behave(machine: ScriptedMachine, conn: MachineConn, sid: int,
                     headers: dict[bytes, bytes]) -> None:
        if len(machine.seen_streams) == 1:
            conn.reset(sid, REFUSED_STREAM)  # never processed: it may go again, POST or not
        else:
            await echo_digest(conn, sid)

    edge, machine = await machine_edge(behave)
    status, _, body = split_response(await exchange_raw(edge.port, post("/up", BODY)))
    assert (status, body) == (200, hashlib.sha256(BODY).hexdigest().encode())
    assert machine.seen_streams == [1, 3]
    await in_flight_drains(edge)


async def test_a_call_above_the_machines_goaway_goes_to_a_new_connection_body_and_all(
        machine_edge: MakeEdge) -> None:
    async def behave(machine: ScriptedMachine, conn: MachineConn, sid: int,
                     headers: dict[bytes, bytes]) -> None:
        if machine.connections == 1:
            conn.goaway(0)  # it processed none of this connection's streams
            await asyncio.sleep(0.1)
            conn.close()
        else:
            await echo_digest(conn, sid)

    edge, machine = await machine_edge(behave)
    status, _, body = split_response(await exchange_raw(edge.port, post("/up", BODY)))
    assert (status, body) == (200, hashlib.sha256(BODY).hexdigest().encode())
    assert machine.connections == 2
    await in_flight_drains(edge)


async def test_a_refused_call_whose_body_outgrew_the_buffer_is_not_sent_again(
        machine_edge: MakeEdge) -> None:
    async def behave(machine: ScriptedMachine, conn: MachineConn, sid: int,
                     headers: dict[bytes, bytes]) -> None:
        await conn.body(sid)  # the whole body went out, then the stream is refused
        conn.reset(sid, REFUSED_STREAM)

    edge, machine = await machine_edge(behave, body_buffer_bytes=16384)
    status, _, _ = split_response(await exchange_raw(edge.port, post("/up", BODY)))
    assert status == 502  # its body was not kept: it cannot go again
    assert machine.seen_streams == [1]
    await in_flight_drains(edge)


INJECTED = b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nINJECTED"


@pytest.mark.parametrize(("method", "status"), [("HEAD", b"200"), ("GET", b"204"),
                                                ("GET", b"304")])
async def test_data_on_an_answer_without_a_body_never_reaches_the_client(
        machine_edge: MakeEdge, method: str, status: bytes) -> None:
    """A machine that sends DATA on a HEAD, 204 or 304 answer (a framework's bug, or an
    attempt to answer the client's next request itself) is not passed on: the client's
    next answer on its kept-alive connection is its own."""
    async def behave(machine: ScriptedMachine, conn: MachineConn, sid: int,
                     headers: dict[bytes, bytes]) -> None:
        if headers[b":path"] == b"/first":
            conn.headers(sid, [(b":status", status)])
            conn.data(sid, INJECTED, end_stream=True)
        else:
            await asyncio.sleep(0.2)  # the real answer to the next request comes late
            answer(conn, sid, b"real")

    edge, _machine = await machine_edge(behave)
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.port)
    writer.write(f"{method} /first HTTP/1.1\r\nHost: rpc.test\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 " + status)
    writer.write(b"GET /second HTTP/1.1\r\nHost: rpc.test\r\nConnection: close\r\n\r\n")
    rest = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert b"INJECTED" not in rest
    status_two, _, body = split_response(rest)
    assert (status_two, body) == (200, b"real")
    await in_flight_drains(edge)


async def misbehave(machine: ScriptedMachine, conn: MachineConn, sid: int,
                    headers: dict[bytes, bytes]) -> None:
    """One misbehaviour a path (after the review of the client core), else a plain 200."""
    path = headers[b":path"]
    if path == b"/upper-ended":
        conn.headers(sid, [(b":status", b"200"), (b"X-Up", b"1")], end_stream=True)
    elif path == b"/upper-data":
        conn.headers(sid, [(b":status", b"200"), (b"X-Up", b"1")])
        conn.data(sid, b"x" * 16000)
        conn.data(sid, b"x" * 14000, end_stream=True)
    elif path == b"/data-first":
        conn.data(sid, b"y" * 16000)
        conn.headers(sid, OK)
        conn.data(sid, b"z" * 16000, end_stream=True)
    elif path == b"/past-length":
        conn.headers(sid, [*OK, (b"content-length", b"5")])
        conn.data(sid, b"w" * 16000, end_stream=True)
    elif path == b"/short":
        conn.headers(sid, [*OK, (b"content-length", b"50000")])
        conn.data(sid, b"s" * 16000, end_stream=True)
    elif path == b"/1xx-ended":
        conn.headers(sid, [(b":status", b"103")], end_stream=True)
    elif path == b"/trailers-open":
        conn.headers(sid, OK)
        conn.data(sid, b"t" * 10000)
        conn.headers(sid, [(b"grpc-status", b"0")])  # trailers that do not end the stream
    elif path == b"/reset":
        conn.headers(sid, OK)
        conn.data(sid, b"r" * 10000)
        conn.reset(sid, 0x2)
    elif path == b"/padded":
        conn.headers(sid, OK)
        conn.raw(0x0, 0x8 | 0x1, sid, bytes([200]) + b"p" * 100 + b"\0" * 200)
    elif path == b"/priority-self":
        conn.headers(sid, OK)
        conn.raw(0x2, 0, sid, struct.pack(">LB", sid, 16))  # depends on itself
    elif path == b"/1xx-then-ok":
        conn.headers(sid, [(b":status", b"100")])
        answer(conn, sid, b"ok")
    else:
        answer(conn, sid, b"ok")


@pytest.mark.parametrize("path", [
    "/upper-ended", "/upper-data", "/data-first", "/past-length", "/short", "/1xx-ended",
    "/trailers-open", "/reset", "/padded", "/priority-self", "/1xx-then-ok"])
async def test_after_any_misbehaving_answer_the_connection_is_at_rest(
        machine_edge: MakeEdge, path: str) -> None:
    """Whatever one answer did, its stream is gone from both the core and the adapter,
    the connection's receive window is whole again, in_flight is 0, and the next call on
    the same machine connection is answered."""
    edge, machine = await machine_edge(misbehave)
    await exchange_raw(edge.port, get(path))
    status, _, body = split_response(await exchange_raw(edge.port, get("/fine")))
    assert (status, body) == (200, b"ok")
    await in_flight_drains(edge)
    conns = [conn for pooled in edge.shell.pool.h2pool().conns.values() for conn in pooled]
    assert machine.connections == 1 and len(conns) == 1
    for conn in conns:
        assert not conn.h2.streams and not conn.streams
        assert conn.h2.recv_window + conn.h2.recv_owed == 1 << 24
