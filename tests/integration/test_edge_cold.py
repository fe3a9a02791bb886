"""The edge's cold path with real sockets: hold, wake through a fake placement that starts
real backend processes, release, expiry, auto-stop, and connect failures."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncIterator

import aiohttp
import msgspec
import pytest

from ground.appconfig import parse
from ground.auth.signing import KeyRing
from tests.support.edge_fakes import EdgeHarness, FakePlacement, start_edge

pytestmark = pytest.mark.integration


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:
        yield client


async def get(session: aiohttp.ClientSession, edge: EdgeHarness, host: str, path: str = "/",
              ) -> tuple[int, str, aiohttp.typedefs.LooseHeaders]:
    async with session.get(f"http://127.0.0.1:{edge.port}{path}", headers={"Host": host}) as r:
        return r.status, await r.text(), r.headers


async def eventually(check: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_a_cold_request_is_held_woken_and_answered_and_the_next_reuses_the_machine(
    session: aiohttp.ClientSession,
) -> None:
    edge = await start_edge([{"name": "hello"}])
    try:
        status, body, headers = await get(session, edge, "hello.localhost")
        assert status == 200 and body == "hello from hello-m1"
        timing = headers["Server-Timing"]
        for phase in ("hold;dur=", "place;dur=", "pull;dur=", "boot;dur="):
            assert phase in timing
        status, body, headers = await get(session, edge, "hello.localhost")
        assert status == 200 and body == "hello from hello-m1"
        assert "Server-Timing" not in headers
        assert edge.placement.wakes == [1]
    finally:
        await edge.close()


async def test_200_concurrent_requests_to_a_cold_app_start_exactly_the_machines_needed(
    session: aiohttp.ClientSession,
) -> None:
    app = {"name": "burst", "max_machines": 3,
           "concurrency": {"soft_limit": 20, "hard_limit": 25}}
    edge = await start_edge([app])
    try:
        results = await asyncio.gather(
            *(get(session, edge, "burst.localhost", "/sleep?ms=20") for _ in range(200))
        )
        assert [status for status, _, _ in results] == [200] * 200
        assert sum(edge.placement.wakes) == min(3, math.ceil(200 / 20))
        assert edge.placement.max_wakes_in_flight == 1
        state = await edge.state()
        assert state["held_total"] == 0
    finally:
        await edge.close()


@pytest.mark.parametrize(
    ("placement", "statuses"),
    [
        (FakePlacement(wake_delay_s=2.0), {504}),
        (FakePlacement(wake_delay_s=0.2, wake_error=(504, "deadline")), {504}),
        (FakePlacement(wake_error=(503, "no_capacity")), {503}),
    ],
    ids=["placement-too-slow", "placement-deadline", "no-capacity"],
)
async def test_a_wake_that_never_succeeds_ends_every_held_request_before_the_deadline(
    session: aiohttp.ClientSession, placement: FakePlacement, statuses: set[int],
) -> None:
    edge = await start_edge([{"name": "sleepy", "hold_timeout_s": 1.0}], placement=placement)
    try:
        began = time.monotonic()
        results = await asyncio.gather(*(get(session, edge, "sleepy.localhost") for _ in range(20)))
        assert time.monotonic() - began < 1.0 + 1.0
        assert {status for status, _, _ in results} == statuses
        for status, body, headers in results:
            assert json.loads(body)["error"] in {"hold_timeout", "deadline", "no_capacity"}
            if status == 503:
                assert headers["Retry-After"] == "1"
        state = await edge.state()
        assert state["held_total"] == 0 and state["apps"]["sleepy"]["held"] == 0
    finally:
        await edge.close()


@pytest.mark.parametrize(
    ("error", "code"),
    [((503, "no_capacity"), "no_capacity"), ((503, "start_failed"), "start_failed"),
     ((500, "internal"), "wake_failed")],
)
async def test_a_failed_wake_tells_the_end_user_a_code_and_the_log_placements_detail(
    session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture, error: tuple[int, str],
    code: str,
) -> None:
    detail = "agent http://10.1.2.3:7001/internal-thing refused the offer"
    placement = FakePlacement(wake_error=error, wake_error_message=detail)
    edge = await start_edge([{"name": "leaky"}], placement=placement)
    try:
        with caplog.at_level(logging.INFO, logger="thaw.edge"):
            async with session.get(f"http://127.0.0.1:{edge.port}/",
                                   headers={"Host": "leaky.localhost",
                                            "X-Request-Id": "req-leak-1"}) as response:
                status, raw, headers = response.status, await response.read(), response.headers
        assert status == 503 and headers["Retry-After"] == "1"
        body = json.loads(raw)
        assert set(body) == {"error", "message"} and body["error"] == code
        for secret in (b"10.1.2.3", b"internal-thing", b"http://", b"7001"):
            assert secret not in raw
        logged = [r.getMessage() for r in caplog.records if "req-leak-1" in r.getMessage()]
        assert any("leaky" in line and "10.1.2.3" in line for line in logged), caplog.text
    finally:
        await edge.close()


async def test_an_image_that_cannot_be_had_is_502_without_retry_after(
    session: aiohttp.ClientSession,
) -> None:
    """Retrying cannot help (placement says image_unavailable): no Retry-After, so clients
    do not retry forever."""
    placement = FakePlacement(wake_error=(424, "image_unavailable"))
    edge = await start_edge([{"name": "imageless"}], placement=placement)
    try:
        status, body, headers = await get(session, edge, "imageless.localhost")
        assert status == 502 and "Retry-After" not in headers
        assert json.loads(body) == {"error": "image_unavailable",
                                    "message": "the app's image is not available"}
    finally:
        await edge.close()


async def test_the_edges_wake_is_signed_and_one_signed_with_another_key_is_refused(
    session: aiohttp.ClientSession,
) -> None:
    placement = FakePlacement()
    edge = await start_edge([{"name": "signed"}], placement=placement)
    try:
        status, _, _ = await get(session, edge, "signed.localhost")
        assert status == 200 and placement.wakes == [1] and placement.unsigned == 0
    finally:
        await edge.close()
    placement = FakePlacement()
    edge = await start_edge([{"name": "forged"}], placement=placement,
                            cluster_keys=KeyRing.parse("f" * 40))
    try:
        status, body, _ = await get(session, edge, "forged.localhost")
        assert (status, json.loads(body)["error"]) == (503, "wake_failed")
        assert placement.unsigned == 1 and placement.wakes == []  # refused, nothing started
    finally:
        await edge.close()


async def test_a_full_hold_queue_answers_503_with_retry_after_at_once(
    session: aiohttp.ClientSession,
) -> None:
    placement = FakePlacement(wake_delay_s=1.5, wake_error=(503, "no_capacity"))
    edge = await start_edge([{"name": "tiny", "max_pending": 2}], placement=placement)
    try:
        held = [asyncio.create_task(get(session, edge, "tiny.localhost")) for _ in range(2)]
        await eventually(lambda: _held(edge, "tiny", 2))
        began = time.monotonic()
        status, body, headers = await get(session, edge, "tiny.localhost")
        assert time.monotonic() - began < 0.5
        assert status == 503 and headers["Retry-After"] == "1"
        assert json.loads(body)["error"] == "queue_full"
        await asyncio.gather(*held)
    finally:
        await edge.close()


async def test_one_apps_flood_of_held_requests_leaves_another_apps_cold_start_alone(
    session: aiohttp.ClientSession,
) -> None:
    """An app may hold at most its share of the edge's hold (here 5 of 20): the rest of
    its flood gets 503 queue_full at once, and another app's cold start is held and
    served, never 503 edge_full."""
    placement = FakePlacement(wake_delay_s=1.0)
    edge = await start_edge([{"name": "flood", "max_pending": 1000}, {"name": "calm"}],
                            placement=placement, max_held_total=20, max_held_share=0.25)
    try:
        flood = [asyncio.create_task(get(session, edge, "flood.localhost")) for _ in range(30)]
        await eventually(lambda: _held(edge, "flood", 5))
        calm_status, calm_body, _ = await get(session, edge, "calm.localhost")
        assert calm_status == 200, calm_body
        answers = await asyncio.gather(*flood)
        codes = [json.loads(body)["error"] for status, body, _ in answers if status != 200]
        assert codes == ["queue_full"] * 25, codes
    finally:
        await edge.close()


async def test_one_clients_flood_of_held_requests_leaves_the_same_apps_other_clients_alone(
) -> None:
    """A client may have at most `max_held_per_client` requests held (here 5): the rest of
    its flood gets 429 too_many_held at once, and another client's request to the same
    cold app is held and served. Behind a trusted proxy each client it names has a bound
    of its own."""
    placement = FakePlacement(wake_delay_s=1.0)
    edge = await start_edge([{"name": "cold", "max_pending": 1000}], placement=placement,
                            max_held_per_client=5, trusted_proxies=("127.0.0.4",))

    async def client(source: str, count: int, says: str = "") -> list[tuple[int, str, str]]:
        headers = {"Host": "cold.localhost", **({"X-Forwarded-For": says} if says else {})}
        connector = aiohttp.TCPConnector(limit=0, local_addr=(source, 0))
        async with aiohttp.ClientSession(connector=connector) as session:
            async def one() -> tuple[int, str, str]:
                async with session.get(f"http://127.0.0.1:{edge.port}/",
                                       headers=headers) as r:
                    return r.status, await r.text(), r.headers.get("Retry-After", "")
            return list(await asyncio.gather(*(one() for _ in range(count))))

    try:
        flood = asyncio.create_task(client("127.0.0.2", 30))
        await eventually(lambda: _held(edge, "cold", 5))
        other = asyncio.create_task(client("127.0.0.3", 1))
        proxied = asyncio.create_task(client("127.0.0.4", 12, says="198.51.100.7"))
        answers = await flood
        refused = [(status, json.loads(body)["error"], retry) for status, body, retry in answers
                   if status != 200]
        assert refused == [(429, "too_many_held", "1")] * 25, refused
        assert [status for status, _, _ in await other] == [200]
        behind = await proxied  # one client named by the proxy: its own bound of 5
        assert sorted(status for status, _, _ in behind) == [200] * 5 + [429] * 7
        assert (await edge.state())["held_total"] == 0
    finally:
        await edge.close()


async def _held(edge: EdgeHarness, app: str, count: int) -> bool:
    state = await edge.state()
    return state["apps"][app]["held"] == count  # type: ignore[index,no-any-return]


@pytest.mark.parametrize(("min_running", "stopped"), [(0, True), (1, False)])
async def test_an_idle_machine_is_auto_stopped_through_placement_only_above_min_running(
    session: aiohttp.ClientSession, min_running: int, stopped: bool,
) -> None:
    app = {"name": "idle", "idle_timeout_s": 0.5, "min_machines_running": min_running,
           "max_machines": 2}
    edge = await start_edge([app], autostop_interval_s=0.1)
    try:
        status, _, _ = await get(session, edge, "idle.localhost")
        assert status == 200
        await asyncio.sleep(1.2)
        assert edge.placement.autostops == (["idle-m1"] if stopped else [])
        state = await edge.state()
        machines = state["apps"]["idle"]["machines"]  # type: ignore[index]
        assert len(machines) == (0 if stopped else 1)
        if stopped:  # the next request wakes it again
            status, _, headers = await get(session, edge, "idle.localhost")
            assert status == 200 and "Server-Timing" in headers
    finally:
        await edge.close()


async def test_a_request_to_a_machine_that_refuses_connects_is_woken_elsewhere_not_502(
    session: aiohttp.ClientSession,
) -> None:
    edge = await start_edge([{"name": "dead"}])
    try:
        await edge.add_machine("dead", "dead-m0", start=False)
        await eventually(lambda: _machines(edge, "dead", 1))
        status, body, _ = await get(session, edge, "dead.localhost")
        assert status == 200 and body == "hello from dead-m1"
        assert edge.placement.wakes == [1]
        state = await edge.state()
        ids = [m["id"] for m in state["apps"]["dead"]["machines"]]  # type: ignore[index]
        assert ids == ["dead-m1"]
    finally:
        await edge.close()


async def test_more_dead_machines_than_connect_attempts_hold_and_wake_never_502(
    session: aiohttp.ClientSession,
) -> None:
    """Four machines refuse connects (the edge tries three): the request is held, a wake
    starts one elsewhere, and every dead machine's worker is reported as suspect once."""
    edge = await start_edge([{"name": "dead"}])
    edge.placement.fail_suspects = True
    try:
        for i in range(4):
            await edge.add_machine("dead", f"gone-{i}", start=False, worker=f"w-dead{i % 2}")
        await eventually(lambda: _machines(edge, "dead", 4))
        status, body, _ = await get(session, edge, "dead.localhost")
        assert status == 200 and body == "hello from dead-m1", body  # the woken machine
        await eventually(lambda: _suspects(edge, 2))
        assert sorted(w for w, _ in edge.placement.suspects) == ["w-dead0", "w-dead1"]
        report = edge.placement.suspects[0][1]
        assert report.reporter and report.machine.startswith("gone-") and report.error
        # placement counted both workers failed: none of their machines is routed to
        state = await edge.state()
        ids = [m["id"] for m in state["apps"]["dead"]["machines"]]  # type: ignore[index]
        assert ids == ["dead-m1"], ids
    finally:
        await edge.close()


async def _suspects(edge: EdgeHarness, count: int) -> bool:
    return len(edge.placement.suspects) >= count


async def _machines(edge: EdgeHarness, app: str, count: int) -> bool:
    state = await edge.state()
    return len(state["apps"][app]["machines"]) == count  # type: ignore[index]


async def test_a_machine_published_in_the_registry_serves_without_a_wake(
    session: aiohttp.ClientSession,
) -> None:
    edge = await start_edge([{"name": "warm"}])
    try:
        await edge.add_machine("warm", "warm-m9")
        await eventually(lambda: _machines(edge, "warm", 1))
        status, body, headers = await get(session, edge, "warm.localhost")
        assert status == 200 and body == "hello from warm-m9"
        assert "Server-Timing" not in headers and edge.placement.wakes == []
    finally:
        await edge.close()


async def test_an_app_whose_hold_timeout_is_under_a_millisecond_is_still_woken(
    session: aiohttp.ClientSession,
) -> None:
    # Placement refuses a wake with less than 1 ms of budget, and the app config's own
    # bound may change: the edge asks for at least 1 ms whatever the hold timeout.
    edge = await start_edge([])
    try:
        config = msgspec.structs.replace(parse({"name": "tiny", "image": "example/hello:v1"}),
                                         hold_timeout_s=0.0004)
        await edge.registry.put_app(config)  # type: ignore[attr-defined]
        async def in_view() -> bool:
            return "tiny" in (await edge.state())["apps"]  # type: ignore[operator]

        await eventually(in_view)
        status, body, _ = await get(session, edge, "tiny.localhost")
        assert status == 504 and json.loads(body)["error"] == "hold_timeout"
        await eventually(lambda: _machines(edge, "tiny", 1))
        assert edge.placement.wakes == [1]
        status, body, _ = await get(session, edge, "tiny.localhost")
        assert status == 200 and body == "hello from tiny-m1"
    finally:
        await edge.close()


async def test_stopping_the_edge_answers_every_held_request(
    session: aiohttp.ClientSession,
) -> None:
    edge = await start_edge([{"name": "held"}], placement=FakePlacement(wake_delay_s=1.0))
    closed = False
    try:
        held = [asyncio.create_task(get(session, edge, "held.localhost")) for _ in range(5)]
        await eventually(lambda: _held(edge, "held", 5))
        await edge.runtime.stop()  # type: ignore[attr-defined]
        closed = True
        results = await asyncio.wait_for(asyncio.gather(*held), 5)
        assert {status for status, _, _ in results} == {503}
    finally:
        if not closed:
            await edge.runtime.stop()  # type: ignore[attr-defined]
        await edge.placement.close()
        for proc in edge.backends:
            proc.terminate()


async def test_a_held_request_whose_body_turns_out_malformed_leaves_the_hold_queue(
    session: aiohttp.ClientSession,
) -> None:
    edge = await start_edge([{"name": "hello"}], FakePlacement(wake_delay_s=0.5))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", edge.port)
        writer.write(b"POST / HTTP/1.1\r\nHost: hello.localhost\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()

        async def held_one() -> bool:
            return (await edge.state())["held_total"] == 1

        await eventually(held_one)
        writer.write(b"zz\r\n")  # not a chunk size
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 400")
        assert (await edge.state())["held_total"] == 0
        status, _, _ = await get(session, edge, "hello.localhost")
        assert status == 200

        async def nothing_in_flight() -> bool:
            state = await edge.state()
            machines = state["apps"]["hello"]["machines"]  # type: ignore[index]
            return all(m["in_flight"] == 0 for m in machines)

        await eventually(nothing_in_flight)
    finally:
        await edge.close()


async def test_a_machine_that_accepts_but_never_answers_gets_a_504_after_the_response_timeout(
    session: aiohttp.ClientSession,
) -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    edge = await start_edge([{"name": "hung"}], response_timeout_s=0.4)
    try:
        await edge.add_machine("hung", "hung-m1", port=port, start=False)

        async def routable() -> bool:
            state = await edge.state()
            return bool(state["apps"]["hung"]["machines"])  # type: ignore[index]

        await eventually(routable)
        began = time.monotonic()
        status, body, _ = await get(session, edge, "hung.localhost")
        assert status == 504 and json.loads(body)["error"] == "upstream_timeout"
        assert time.monotonic() - began < 0.4 + 1.0
        state = await edge.state()
        assert all(m["in_flight"] == 0 for m in state["apps"]["hung"]["machines"])  # type: ignore[index]
    finally:
        await edge.close()
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_a_request_that_crashes_its_machine_is_sent_again_max_resends_times_then_502(
    session: aiohttp.ClientSession,
) -> None:
    """A request of death: every machine it reaches dies before answering. It goes out
    1 + max_resends times (3 by default), then 502 without a body from inside; the fourth
    machine lives and serves the next request."""
    edge = await start_edge([{"name": "doom"}])
    try:
        for i in range(4):
            await edge.add_machine("doom", f"doom-{i}")
        await eventually(lambda: _machines(edge, "doom", 4))
        status, body, _ = await get(session, edge, "doom.localhost", "/crash")
        assert status == 502 and json.loads(body)["error"] == "bad_gateway", body
        assert "127.0.0.1" not in body and "doom-" not in body
        # a machine's socket closes a moment before its exit can be reaped
        await eventually(lambda: _dead(edge, 3))
        assert not edge.placement.procs  # none was woken: three machines were left
        status, body, _ = await get(session, edge, "doom.localhost")
        assert status == 200 and body.startswith("hello from doom-"), body
        assert await _dead(edge, 3)
    finally:
        await edge.close()


async def test_with_max_resends_0_a_lost_request_is_never_sent_again(
    session: aiohttp.ClientSession,
) -> None:
    edge = await start_edge([{"name": "doom"}], max_resends=0)
    try:
        for i in range(2):
            await edge.add_machine("doom", f"doom-{i}")
        await eventually(lambda: _machines(edge, "doom", 2))
        status, _, _ = await get(session, edge, "doom.localhost", "/crash")
        assert status == 502
        await eventually(lambda: _dead(edge, 1))
        status, _, _ = await get(session, edge, "doom.localhost")
        assert status == 200 and await _dead(edge, 1)

    finally:
        await edge.close()


async def _dead(edge: EdgeHarness, count: int) -> bool:
    """Exactly `count` of the edge's machines have exited (more fails at once)."""
    dead = sum(proc.poll() is not None for proc in edge.backends)
    assert dead <= count, f"{dead} machines died, {count} expected"
    return dead == count


async def test_a_connection_whose_held_body_outgrew_the_buffer_reads_on_after_its_answer(
) -> None:
    """A held POST whose whole body came in at once but over `body_buffer_bytes` (reading
    paused) is answered without reaching a machine (its wake failed): the body is
    dropped and reading goes on, so the connection's next request is answered."""
    edge = await start_edge([{"name": "full"}], body_buffer_bytes=1024,
                            placement=FakePlacement(wake_error=(503, "no_capacity")))
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.port)
    try:
        body = b"x" * 4096
        writer.write(b"POST / HTTP/1.1\r\nHost: full.localhost\r\nContent-Length: %d\r\n\r\n"
                     % len(body) + body)
        for _ in range(2):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 503") and b"connection: close" not in head.lower()
            length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            writer.write(b"GET / HTTP/1.1\r\nHost: full.localhost\r\n\r\n")  # the next one
    finally:
        writer.close()
        await edge.close()
