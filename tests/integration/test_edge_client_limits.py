"""One client cannot take the edge from the others: its connections and its HTTP/2
resets are limited across everything it opens (edge/core/clients.py), with real sockets.

Clients are told apart by address: on loopback an attacker connects from 127.0.0.2 or
127.0.0.3 (any 127/8 address is this host), the observer from 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from pathlib import Path

import h2.errors
import h2.exceptions
import pytest

from edge.config import TlsConfig
from edge.core.clients import PER_TURN
from tests.support.edge_fakes import start_warm_edge
from tests.support.h2client import H2Client
from thaw.localca import LocalCA

pytestmark = pytest.mark.integration

WEB = b"web.localhost"
GET = b"GET / HTTP/1.1\r\nHost: web.localhost\r\n\r\n"


async def warm_requests(port: int, count: int) -> list[int]:
    """`count` GETs from 127.0.0.1 over one keep-alive connection at a time (ten
    connections, each on its own), their statuses."""
    statuses: list[int] = []

    async def one_connection(n: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(n):
                writer.write(GET)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                statuses.append(status)
        finally:
            writer.close()

    await asyncio.gather(*(one_connection(count // 10) for _ in range(10)))
    return statuses


@pytest.mark.slow
async def test_5000_idle_connections_from_one_client_leave_another_clients_requests_alone(
) -> None:
    async with await start_warm_edge() as edge:
        config = edge.shell.config
        idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            for _ in range(50):  # 5,000 in all, 100 at a time
                idle += await asyncio.gather(*(asyncio.open_connection(
                    "127.0.0.1", edge.port, local_addr=("127.0.0.2", 0)) for _ in range(100)))
            statuses = await warm_requests(edge.port, 1000)
            assert statuses.count(200) >= 999, statuses  # >= 99.9 %
            held = edge.shell.clients.open_connections(b"127.0.0.2")
            assert held <= config.max_conns_per_client
            # the rest were answered 429 and closed, at once
            refused = 0
            for reader, _ in idle:
                with contextlib.suppress(TimeoutError):
                    data = await asyncio.wait_for(reader.read(200), 0.01)
                    refused += data.startswith(b"HTTP/1.1 429")
            assert refused >= 5000 - held - 5, (refused, held)
        finally:
            for _, writer in idle:
                writer.close()


HEADERS = b"GET /headers HTTP/1.1\r\nHost: web.localhost\r\n\r\n"


def forwarded_at(headers: bytes) -> int:
    """The place among the edge's forwarded requests of the one whose headers the
    backend echoed (/headers): the edge numbers them in the order it forwards them."""
    request_id = dict(json.loads(headers))["X-Request-Id"]
    return int(request_id.rsplit("-", 1)[1], 16)


async def echoed_headers(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n")[0])
    return await reader.readexactly(length)


async def test_a_clients_burst_of_requests_is_taken_a_share_a_turn_and_anothers_goes_first(
) -> None:
    """64 connections from one client send a request each in the same instant as one from
    another client: the edge takes PER_TURN of the burst a turn, so the other client's
    request is among the first forwarded, not after the whole burst."""
    async with await start_warm_edge() as edge:
        burst = await asyncio.gather(*(asyncio.open_connection(
            "127.0.0.1", edge.port, local_addr=("127.0.0.2", 0)) for _ in range(64)))
        other = await asyncio.open_connection("127.0.0.1", edge.port)
        await asyncio.sleep(0.1)  # every connection accepted before the requests
        try:
            for _, writer in burst:  # all written before the loop turns: one read for
                writer.write(HEADERS)  # the edge, the other client's last
            other[1].write(HEADERS)
            places = await asyncio.wait_for(asyncio.gather(
                *(echoed_headers(reader) for reader, _ in [*burst, other])), 30)
        finally:
            for _, writer in [*burst, other]:
                writer.close()
        ranks = sorted(forwarded_at(h) for h in places)
        # taken all in one turn, it would be forwarded last (65th)
        assert ranks.index(forwarded_at(places[-1])) < 2 * PER_TURN, ranks
        assert edge.shell.clients.deferred >= 64 // PER_TURN - 1


async def test_a_clients_streams_over_several_h2_connections_share_one_turn_budget() -> None:
    """4 HTTP/2 connections from one client open 32 streams each in the same instant as
    another client's stream: the client's streams are taken PER_TURN a turn over all its
    connections (not 8 per connection: 32), the other client's among the first."""
    async with await start_warm_edge() as edge:
        clients = [await H2Client.open(edge.port, source="127.0.0.2") for _ in range(4)]
        other = await H2Client.open(edge.port)
        try:
            for client in [*clients, other]:  # settings exchanged
                assert (await client.request(WEB)).status == 200
            streams = [(client, client.start(WEB, b"/headers"))
                       for client in clients for _ in range(32)]
            await asyncio.sleep(0)  # the edge reads them in the loop's next turn
            streams.append((other, other.start(WEB, b"/headers")))  # read in the one after
            for client, sid in streams:
                await asyncio.wait_for(client.answers[sid].done.wait(), 30)
        finally:
            for client in [*clients, other]:
                await client.close()
        answers = [client.answers[sid] for client, sid in streams]
        assert all(answer.status == 200 for answer in answers)
        ranks = sorted(forwarded_at(bytes(a.body)) for a in answers)
        # taken 8 per connection a turn, it would be forwarded after 32 of the burst
        assert ranks.index(forwarded_at(bytes(answers[-1].body))) < 2 * PER_TURN, ranks


async def reset_storm(port: int, source: str, streams: int, kind: str = "rapid-reset"
                      ) -> tuple[int, int | None]:
    """Streams reset again and again on one connection, until `streams` or the edge's
    GOAWAY: (streams sent, the GOAWAY's error code or None). `kind`: "rapid-reset"
    (HEADERS then the client's RST_STREAM, CVE-2023-44487) or "made-you-reset" (a POST
    whose DATA runs past its content-length: the edge resets it, CVE-2025-8671)."""
    client = await H2Client.open(port, source=source)
    sent = 0
    try:
        while sent < streams and client.goaway is None and not client.closed.is_set():
            try:
                for _ in range(20):
                    stream_id = client.conn.get_next_available_stream_id()
                    if kind == "rapid-reset":
                        client.conn.send_headers(stream_id, [
                            (b":method", b"GET"), (b":scheme", b"http"), (b":authority", WEB),
                            (b":path", b"/sleep?ms=50")], end_stream=True)
                        client.conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                    else:
                        client.conn.send_headers(stream_id, [
                            (b":method", b"POST"), (b":scheme", b"http"), (b":authority", WEB),
                            (b":path", b"/sleep?ms=50"), (b"content-length", b"1")])
                        client.conn.send_data(stream_id, b"xx", end_stream=True)
                    sent += 1
            except (h2.exceptions.ProtocolError, h2.exceptions.StreamClosedError):
                break  # the GOAWAY came in
            client.flush()
            await asyncio.sleep(0.005)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(client.closed.wait(), 0.2)
        return sent, client.goaway.error_code if client.goaway is not None else None
    finally:
        await client.close()


async def test_resets_across_reconnects_cut_the_client_off_and_others_are_served(
) -> None:
    """Under its per-connection budget each time (150 resets, then a new connection),
    a client still spends its own budget, which outlives the connection: it gets
    GOAWAY ENHANCE_YOUR_CALM within that budget, and its next connection is refused at
    once (barred); a client at another address is served throughout."""
    async with await start_warm_edge() as edge:
        limits = edge.shell.config
        began = time.monotonic()
        storms: list[tuple[int, int | None]] = []
        while not storms or storms[-1][1] is None:
            storms.append(await reset_storm(edge.port, "127.0.0.3", 150))
            assert len(storms) < 100, storms  # never cut off
        elapsed = time.monotonic() - began
        assert storms[-1][1] == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, storms
        sent = sum(n for n, _ in storms)
        # the budget: a burst of twice the rate, then the rate (and one batch in flight)
        assert sent <= limits.h2_client_resets_per_s * (2 + elapsed) + 20, (sent, elapsed)
        assert len(storms) > 1  # it took reconnects: no one connection went over its own
        barred = await reset_storm(edge.port, "127.0.0.3", 150)
        assert barred == (0, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM) or barred[0] <= 20, barred
        assert edge.shell.clients.refused["barred"] >= 1
        assert await answer_to_barred(edge.port, "127.0.0.3") == "reset"
        statuses = await warm_requests(edge.port, 200)
        assert statuses == [200] * 200


async def answer_to_barred(port: int, source: str) -> bytes | str:
    """What a barred client's next connection gets, before it sends anything: a reset
    ("reset"), where a client only over its new connections gets a 429 — not an orderly
    close (b"") that would leave the connection in TIME_WAIT at the edge."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                   local_addr=(source, 0))
    try:
        return await asyncio.wait_for(reader.read(), 5)
    except ConnectionResetError:
        return "reset"
    finally:
        writer.close()


async def test_a_trusted_proxy_is_not_limited_as_one_client() -> None:
    harness = await start_warm_edge(trusted_proxies=("127.0.0.4",), max_conns_per_client=5)
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        conns = list(await asyncio.gather(*(asyncio.open_connection(
            "127.0.0.1", harness.port, local_addr=("127.0.0.4", 0)) for _ in range(8))))
        for _, writer in conns:
            writer.write(GET)
        heads = [await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                 for reader, _ in conns]
        assert all(head.startswith(b"HTTP/1.1 200") for head in heads)  # 8 over 5
        assert harness.shell.clients.open_connections(b"127.0.0.4") == 0  # not counted
    finally:
        for _, writer in conns:
            writer.close()
        await harness.close()


async def test_tls_connections_are_counted_against_their_client_before_the_handshake(
    tmp_path: Path,
) -> None:
    """Handshakes a client aborts spend its new connections too: past them the door closes
    its connections before any TLS state is made, and another client's handshake and
    request go through."""
    ca = LocalCA(tmp_path / "ca", domain="test")
    harness = await start_warm_edge(domain="test", new_conns_per_s=10, new_conns_burst=20,
                                    tls=TlsConfig(port=0, issuer=ca.issue))
    try:
        port = harness.runtime.tls_port  # type: ignore[attr-defined]
        for _ in range(60):  # a partial ClientHello, then gone
            _, writer = await asyncio.open_connection("127.0.0.1", port,
                                                      local_addr=("127.0.0.6", 0))
            writer.write(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
            writer.close()
        refused = harness.shell.clients.refused["new_connections"]
        assert refused >= 60 - 2 * 10 - 5, refused  # a burst of 20, then 10 a second
        context = ssl.create_default_context(cafile=str(ca.cert_path))
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                       server_hostname="web.test")
        writer.write(b"GET / HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n")
        assert (await asyncio.wait_for(reader.read(), 10)).startswith(b"HTTP/1.1 200")
        writer.close()
    finally:
        await harness.close()


@pytest.mark.parametrize("kind", ["rapid-reset", "made-you-reset"])
async def test_a_reset_storm_with_reconnects_is_cut_off_while_others_are_served_and_wakes_nothing(
    kind: str,
) -> None:
    """Rapid reset and MadeYouReset from one client, reconnecting each time it nears its
    per-connection budget, beside a steady warm load from another: the client is cut off
    within its own budget (GOAWAY ENHANCE_YOUR_CALM, then barred), the other client's
    requests succeed (>= 99 %), and the app gets no wake from streams that were reset."""
    async with await start_warm_edge() as edge:
        limits = edge.shell.config

        async def storm() -> tuple[list[tuple[int, int | None]], float]:
            began = time.monotonic()
            storms: list[tuple[int, int | None]] = []
            while not storms or storms[-1][1] is None:
                storms.append(await reset_storm(edge.port, "127.0.0.3", 150, kind))
                assert len(storms) < 100, storms  # never cut off
            return storms, time.monotonic() - began

        (storms, elapsed), statuses = await asyncio.gather(storm(),
                                                           warm_requests(edge.port, 1000))
        assert storms[-1][1] == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, storms
        assert len(storms) > 1  # it took reconnects: no one connection went over its own
        sent = sum(n for n, _ in storms)
        assert sent <= limits.h2_client_resets_per_s * (2 + elapsed) + 20, (sent, elapsed)
        assert statuses.count(200) >= 990, statuses
        assert edge.placement.wakes == []  # the app's one machine was enough throughout
        barred = await reset_storm(edge.port, "127.0.0.3", 150, kind)
        assert barred == (0, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM) or barred[0] <= 20, barred


async def test_pipelined_requests_of_a_client_start_within_its_share_and_all_are_answered(
) -> None:
    """16 connections from one client each pipeline 4 requests: the queued ones start
    within the client's share of each turn, and every one is answered, in order on its
    connection (none is left waiting for a turn that never comes)."""
    async with await start_warm_edge() as edge:
        conns = await asyncio.gather(*(asyncio.open_connection(
            "127.0.0.1", edge.port, local_addr=("127.0.0.2", 0)) for _ in range(16)))
        await asyncio.sleep(0.1)
        try:
            for _, writer in conns:
                writer.write(HEADERS * 4)
            places = [[forwarded_at(await asyncio.wait_for(echoed_headers(reader), 30))
                       for _ in range(4)] for reader, _ in conns]
        finally:
            for _, writer in conns:
                writer.close()
        assert all(sorted(mine) == mine for mine in places)  # each connection's in order
        assert edge.shell.clients.deferred >= 1
