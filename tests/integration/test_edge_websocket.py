"""WebSockets through the edge, with real sockets and examples/hello as the machine: the
upgrade is held and woken like any request, the edge tunnels bytes both ways, either side
can close, an idle tunnel is closed, and an open tunnel keeps its machine from auto-stop."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest

from tests.support.edge_fakes import EdgeHarness, FakePlacement, exchange_raw, split_response
from tests.support.edge_fakes import start_edge as start

pytestmark = pytest.mark.integration


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


def url(edge: EdgeHarness) -> str:
    return f"http://127.0.0.1:{edge.port}/ws"


async def test_a_websocket_to_a_cold_app_is_woken_and_echoes_a_mebibyte_both_ways(
    session: aiohttp.ClientSession,
) -> None:
    edge = await start([{"name": "echo"}], FakePlacement(backend="hello"))
    try:
        async with session.ws_connect(url(edge), headers={"Host": "echo.localhost"}) as ws:
            assert edge.placement.wakes == [1]  # the upgrade request woke the app
            await ws.send_str("hi")
            assert (await ws.receive(timeout=10)).data == "hi"
            payload = os.urandom(1 << 20)
            await ws.send_bytes(payload)
            message = await ws.receive(timeout=20)
            assert message.type == aiohttp.WSMsgType.BINARY and message.data == payload
            await ws.close()  # the client closes: the machine answers the close
            assert ws.close_code == 1000
        state = await edge.state()
        assert state["apps"]["echo"]["in_flight"] == 0  # type: ignore[index]
    finally:
        await edge.close()


async def test_the_machine_closing_closes_the_client_side(
    session: aiohttp.ClientSession,
) -> None:
    edge = await start([{"name": "echo"}], FakePlacement(backend="hello"))
    try:
        async with session.ws_connect(url(edge), headers={"Host": "echo.localhost"}) as ws:
            await ws.send_str("close-me")  # the example closes with 1000 when asked so
            message = await ws.receive(timeout=10)
            assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            assert ws.close_code == 1000 or (await ws.receive(timeout=5)).type == \
                aiohttp.WSMsgType.CLOSED
    finally:
        await edge.close()


async def test_an_open_tunnel_keeps_its_machine_from_auto_stop_until_it_closes(
    session: aiohttp.ClientSession,
) -> None:
    app = {"name": "echo", "idle_timeout_s": 0.3}
    edge = await start([app], FakePlacement(backend="hello"), autostop_interval_s=0.1)
    try:
        async with session.ws_connect(url(edge), headers={"Host": "echo.localhost"}) as ws:
            await asyncio.sleep(1.0)  # three idle timeouts with the tunnel open
            assert edge.placement.autostops == []
            await ws.send_str("still here")
            assert (await ws.receive(timeout=10)).data == "still here"
        deadline = time.monotonic() + 10
        while edge.placement.autostops != ["echo-m1"]:
            assert time.monotonic() < deadline, "the machine was never auto-stopped"
            await asyncio.sleep(0.05)
    finally:
        await edge.close()


async def test_an_idle_tunnel_is_closed_after_its_timeout(
    session: aiohttp.ClientSession,
) -> None:
    edge = await start([{"name": "echo"}], FakePlacement(backend="hello"),
                       tunnel_idle_timeout_s=0.5)
    try:
        async with session.ws_connect(url(edge), headers={"Host": "echo.localhost"}) as ws:
            message = await ws.receive(timeout=10)  # nothing sent: the edge closes it
            assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                                    aiohttp.WSMsgType.ERROR)
        state = await edge.state()
        assert state["apps"]["echo"]["in_flight"] == 0  # type: ignore[index]
    finally:
        await edge.close()


async def test_a_machine_that_refuses_the_upgrade_answers_as_usual_and_the_connection_closes(
) -> None:
    edge = await start([{"name": "echo"}], FakePlacement(backend="hello"))
    try:
        data = await exchange_raw(edge.port, (
            b"GET / HTTP/1.1\r\nHost: echo.localhost\r\nConnection: Upgrade\r\n"
            b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"))
        status, headers, body = split_response(data)
        assert status == 200 and body.startswith(b"hello from echo-m1")
        assert headers.get("connection") == "close"
    finally:
        await edge.close()


async def test_an_upgrade_to_anything_but_websocket_is_still_501() -> None:
    edge = await start([{"name": "echo"}], FakePlacement(backend="hello"))
    try:
        data = await exchange_raw(edge.port, (
            b"GET / HTTP/1.1\r\nHost: echo.localhost\r\nConnection: Upgrade\r\n"
            b"Upgrade: smtp\r\n\r\n"))
        assert split_response(data)[0] == 501
        assert edge.placement.wakes == []
    finally:
        await edge.close()


async def test_idle_tunnels_at_their_limit_leave_the_machines_requests_alone(
    session: aiohttp.ClientSession,
) -> None:
    """A machine's WebSocket tunnels may take `tunnel_share` (80 %) of its hard_limit:
    with 4 idle tunnels on a machine of hard_limit 5, a 5th upgrade is 503 tunnels_full
    at once, and 200 requests are all served by the same machine, none held."""
    app = {"name": "echo", "concurrency": {"soft_limit": 5, "hard_limit": 5}}
    edge = await start([app], FakePlacement(backend="hello"))
    tunnels = []
    try:
        for _ in range(4):
            tunnels.append(await session.ws_connect(url(edge),
                                                    headers={"Host": "echo.localhost"}))
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(url(edge), headers={"Host": "echo.localhost"})
        assert refused.value.status == 503
        statuses = []
        for _ in range(200):
            async with session.get(f"http://127.0.0.1:{edge.port}/",
                                   headers={"Host": "echo.localhost"}) as answer:
                statuses.append(answer.status)
        assert statuses == [200] * 200
        assert edge.placement.wakes == [1]  # no request was ever held for want of room
        for ws in tunnels:  # the tunnels still work
            await ws.send_str("ping")
            assert (await ws.receive(timeout=10)).data == "ping"
    finally:
        for ws in tunnels:
            await ws.close()
        await edge.close()


async def test_one_client_at_its_tunnel_bound_gets_429_and_another_client_still_opens_tunnels(
    session: aiohttp.ClientSession,
) -> None:
    """max_tunnels_per_client 2: a client's third upgrade is 429 too_many_tunnels at once,
    while another client (another address) opens its own on the same app; a closed tunnel
    gives its client room again."""
    app = {"name": "echo", "concurrency": {"soft_limit": 10, "hard_limit": 10}}
    edge = await start([app], FakePlacement(backend="hello"), max_tunnels_per_client=2)
    other = aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.2", 0)))
    mine, theirs = [], []
    try:
        for _ in range(2):
            mine.append(await session.ws_connect(url(edge), headers={"Host": "echo.localhost"}))
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(url(edge), headers={"Host": "echo.localhost"})
        assert refused.value.status == 429
        assert refused.value.headers is not None and "Retry-After" in refused.value.headers
        for _ in range(2):
            theirs.append(await other.ws_connect(url(edge), headers={"Host": "echo.localhost"}))
        await mine.pop().close()
        await wait_for(lambda: edge.shell.tunnels.of(b"127.0.0.1") == 1)
        mine.append(await session.ws_connect(url(edge), headers={"Host": "echo.localhost"}))
        for ws in (*mine, *theirs):
            await ws.send_str("ping")
            assert (await ws.receive(timeout=10)).data == "ping"
    finally:
        for ws in (*mine, *theirs):
            await ws.close()
        await other.close()
        await edge.close()
    assert edge.shell.tunnels.of(b"127.0.0.1") == 0 and len(edge.shell.tunnels) == 0


async def wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "never came true"
        await asyncio.sleep(0.01)
