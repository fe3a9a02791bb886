"""gRPC apps through the edge: an app whose `protocol` is "h2c" is a real grpcio server,
spoken to in HTTP/2 (edge/adapters/h2upstream.py), and called by a real grpcio client
over h2c and over TLS. A call to a cold app is held and woken as any request; unary,
server-streaming, client-streaming and bidirectional calls; status, message and
trailing metadata arrive intact; bodies larger than every window go through both ways;
a client's cancel reaches the machine; `grpc-timeout` bounds the hold."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path

import grpc
import pytest

from edge.config import TlsConfig
from tests.support.edge_fakes import BLOCK, EdgeHarness, FakePlacement, start_edge
from tests.support.h2client import H2Client
from thaw.localca import LocalCA

pytestmark = pytest.mark.integration

HOST = "rpc.test"
APP = {"name": "rpc", "protocol": "h2c"}  # routed as rpc.test (the domain is "test")
SERVICE = "/thaw.test.Probe/"


def channel(port: int, ca: LocalCA | None = None) -> grpc.Channel:
    options = [("grpc.default_authority", HOST), ("grpc.enable_retries", 0)]
    if ca is None:
        return grpc.insecure_channel(f"127.0.0.1:{port}", options=options)
    credentials = grpc.ssl_channel_credentials(root_certificates=ca.cert_path.read_bytes())
    return grpc.secure_channel(f"127.0.0.1:{port}", credentials,
                               options=[*options, ("grpc.ssl_target_name_override", HOST)])


def unary(chan: grpc.Channel, method: str, request: bytes, timeout_s: float = 20
          ) -> tuple[bytes, dict[str, str]]:
    call = chan.unary_unary(SERVICE + method)
    answer, state = call.with_call(request, timeout=timeout_s)
    return answer, dict(state.trailing_metadata())


async def grpc_edge(**config: object) -> EdgeHarness:
    return await start_edge([APP], placement=FakePlacement(backend="grpc"), domain="test",
                            **config)


async def test_a_call_to_a_cold_grpc_app_is_woken_and_every_kind_of_call_works() -> None:
    edge = await grpc_edge()
    try:
        chan = channel(edge.port)

        def calls() -> None:
            answer, trailing = unary(chan, "Say", b"hi")  # cold: held, woken
            assert answer == b"echo:hi" and trailing["x-machine"] == "rpc-m1"
            assert list(chan.unary_stream(SERVICE + "Count")(b"5", timeout=20)) == [
                b"0", b"1", b"2", b"3", b"4"]
            chat = chan.stream_stream(SERVICE + "Chat")(iter([b"a", b"b", b"c"]), timeout=20)
            assert list(chat) == [b"re:a", b"re:b", b"re:c"]
            seen = json.loads(unary(chan, "Headers", b"")[0])
            assert seen["x-forwarded-for"] == "127.0.0.1" and seen["x-request-id"]
            with pytest.raises(grpc.RpcError) as failed:
                unary(chan, "Fail", b"")
            error = failed.value
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
            assert error.details() == "bad input"  # type: ignore[attr-defined]
            assert dict(error.trailing_metadata())["x-detail"] == "why"  # type: ignore[attr-defined]

        await asyncio.to_thread(calls)
        chan.close()
        assert edge.placement.wakes == [1]  # one wake, then the machine served them all
    finally:
        await edge.close()


async def test_bodies_larger_than_every_window_go_through_both_ways() -> None:
    edge = await grpc_edge()
    try:
        chan = channel(edge.port)
        messages = [BLOCK[i % 256:] + BLOCK[:i % 256] for i in range(64)]  # 4 MiB up

        def big() -> None:
            up = chan.stream_unary(SERVICE + "Upload")(iter(messages), timeout=60)
            assert up == hashlib.sha256(b"".join(messages)).hexdigest().encode()
            down = list(chan.unary_stream(SERVICE + "Download")(b"40 262144", timeout=60))
            assert len(down) == 40 and all(len(m) == 262144 for m in down)  # 10 MiB down

        await asyncio.to_thread(big)
        chan.close()
    finally:
        await edge.close()


async def test_a_clients_cancel_reaches_the_machine_as_its_streams_cancel() -> None:
    edge = await grpc_edge()
    try:
        chan = channel(edge.port)

        def cancelled() -> int:
            unary(chan, "Say", b"wake")
            with pytest.raises(grpc.RpcError) as late:
                unary(chan, "Slow", b"", timeout_s=0.5)  # the client gives up: RST_STREAM
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
            deadline = time.monotonic() + 10
            while int(unary(chan, "Cancels", b"")[0]) == 0:
                assert time.monotonic() < deadline, "the machine never saw the cancel"
                time.sleep(0.05)
            return int(unary(chan, "Cancels", b"")[0])

        assert await asyncio.to_thread(cancelled) == 1
        chan.close()
        state = await edge.state()
        assert state["apps"]["rpc"]["in_flight"] == 0  # type: ignore[index]
    finally:
        await edge.close()


async def test_grpc_timeout_bounds_how_long_a_call_is_held() -> None:
    """A client that sends `grpc-timeout: 300m` and does not cancel (raw frames) gets
    the edge's answer while the app's wake is still under way (it takes 30 s here)."""
    edge = await start_edge([APP], placement=FakePlacement(backend="grpc", wake_delay_s=30),
                            domain="test")
    try:
        client = await H2Client.open(edge.port)
        try:
            answer = await client.request(
                HOST.encode(), (SERVICE + "Say").encode(), b"POST", body=b"\x00\x00\x00\x00\x02hi",
                extra=[(b"content-type", b"application/grpc"), (b"te", b"trailers"),
                       (b"grpc-timeout", b"300m")], timeout_s=10)
        finally:
            await client.close()
        # the edge's 504 hold_timeout, in gRPC's terms: DEADLINE_EXCEEDED (4), no body
        assert (answer.status, bytes(answer.body)) == (200, b"")
        assert answer.headers[b"content-type"] == b"application/grpc"
        assert answer.trailers == {b"grpc-status": b"4",
                                   b"grpc-message": b"the app did not become ready in time"}
        assert edge.placement.wakes_in_flight == 1  # the deadline ended it, not the wake
    finally:
        await edge.close()


async def test_over_tls_a_grpc_client_reaches_the_h2c_machine(tmp_path: Path) -> None:
    ca = LocalCA(tmp_path / "ca", domain="test")
    edge = await grpc_edge(tls=TlsConfig(port=0, issuer=ca.issue))
    try:
        chan = channel(edge.runtime.tls_port, ca)  # type: ignore[attr-defined]

        def calls() -> None:
            assert unary(chan, "Say", b"tls")[0] == b"echo:tls"
            chat = chan.stream_stream(SERVICE + "Chat")(iter([b"x", b"y"]), timeout=20)
            assert list(chat) == [b"re:x", b"re:y"]

        await asyncio.to_thread(calls)
        chan.close()
    finally:
        await edge.close()


async def test_many_calls_share_one_connection_to_the_machine() -> None:
    edge = await grpc_edge()
    try:
        chan = channel(edge.port)
        unary_call = chan.unary_unary(SERVICE + "Say")

        def burst() -> list[bytes]:
            unary(chan, "Say", b"wake")
            pending = [unary_call.future(b"%d" % i, timeout=20) for i in range(50)]
            return [f.result() for f in pending]

        answers = await asyncio.to_thread(burst)
        assert answers == [b"echo:%d" % i for i in range(50)]
        chan.close()
        pool = edge.shell.pool.h2
        assert pool is not None
        assert sum(len(conns) for conns in pool.conns.values()) == 1
    finally:
        await edge.close()


async def test_the_edges_own_answers_to_a_grpc_call_are_grpc_statuses() -> None:
    edge = await grpc_edge()
    try:
        def unknown_app() -> grpc.RpcError:
            options = [("grpc.default_authority", "nope.test")]
            with (grpc.insecure_channel(f"127.0.0.1:{edge.port}", options=options) as chan,
                  pytest.raises(grpc.RpcError) as failed):
                chan.unary_unary(SERVICE + "Say")(b"hi", timeout=10)
            return failed.value

        error = await asyncio.to_thread(unknown_app)
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
        assert "no app" in error.details()  # type: ignore[attr-defined]
        assert "127.0.0.1" not in error.details()  # type: ignore[attr-defined]
    finally:
        await edge.close()
