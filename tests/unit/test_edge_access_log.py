"""The edge's access log: which answers are logged, what a line says, how lines are written
(in-memory transports and a temp file; no sockets, no sleeps)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge.adapters.accesslog import GONE_LINES_PER_S, LINE_BYTES, AccessLog
from edge.config import EdgeConfig
from edge.core.accessline import Line
from edge.core.accesslog import encode, line, logged, path_of
from edge.view import View
from ground.appconfig import parse
from tests.support.credentials import RING

if TYPE_CHECKING:
    from edge.service import Edge

REQUEST = (b"GET /items/7?token=secret HTTP/1.1\r\nHost: web.localhost\r\n"
           b"X-Request-Id: req-1\r\n\r\n")
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"


def text(**fields: Any) -> bytes:
    """One line as the log writes it."""
    return encode([line(**fields)])


def entry(n: int) -> Line:
    """A line numbered `n` (in its request_id)."""
    return line(ts=1.0, request_id=str(n), app="", machine="", worker="", method="GET",
                host="h", path="/", proto="h2", status=200, code="", bytes_in=0,
                bytes_out=0, duration_s=0.0, client="::1", cold=None)


def sized(n: int) -> tuple[Line, int]:
    """Line `n`, and its size as the log counts it (its texts: "/", "h", no request id)."""
    return entry(n), LINE_BYTES + 2


def never() -> float:
    raise AssertionError("no draw was needed")


def test_cold_requests_and_5xx_are_always_logged_others_by_the_sample_rate() -> None:
    assert logged(200, True, 0.0, never) and logged(503, False, 0.0, never)
    assert logged(200, False, 1.0, never)
    assert not logged(200, False, 0.0, never)
    assert logged(404, False, 0.25, lambda: 0.2) and not logged(404, False, 0.25, lambda: 0.3)


def test_the_path_leaves_the_query_string_out() -> None:
    assert path_of(b"/a/b?token=x&y=1") == "/a/b" and path_of(b"/") == "/"
    assert path_of(b"/?") == "/" and path_of(b"/\xe9?x") == "/\xe9"


def test_a_warm_line_has_no_wake_phases_and_a_cold_one_has_them_all() -> None:
    base: dict[str, Any] = dict(
        ts=1.5, request_id="r", app="web", machine="m1", worker="w1", method="GET",
        host="web.localhost", path="/", proto="http/1.1", status=200, code="", bytes_in=0,
        bytes_out=5, duration_s=0.00025, client="127.0.0.1")
    warm_text = text(**base, cold=None)
    assert warm_text.endswith(b"}\n") and warm_text.count(b"\n") == 1
    warm = json.loads(warm_text)
    assert list(warm) == ["ts", "request_id", "app", "machine", "worker", "method", "host",
                          "path", "proto", "status", "code", "bytes_in", "bytes_out",
                          "duration_ms", "client", "cold"]
    assert warm["cold"] is False and warm["duration_ms"] == 0.25
    cold = json.loads(text(**base, cold=(0.12, 10.0, 0.0, 100.0)))
    assert cold["cold"] is True
    assert [cold[k] for k in ("hold_ms", "place_ms", "pull_ms", "boot_ms")] == [
        120.0, 10.0, 0.0, 100.0]


def test_a_line_escapes_what_a_client_sent() -> None:
    found = json.loads(text(ts=1.0, request_id='a"b\\c\x01', app="", machine="", worker="",
                            method="GET", host="h", path='/"x', proto="h2", status=404,
                            code="unknown_app", bytes_in=0, bytes_out=0, duration_s=0.0,
                            client="::1", cold=None))
    assert found["request_id"] == 'a"b\\c\x01' and found["path"] == '/"x'


async def test_lines_are_written_in_order_in_batches_and_the_file_is_reopened_when_moved(
    tmp_path: Path,
) -> None:
    path = tmp_path / "access.log"
    log = AccessLog(str(path), 1.0, asyncio.get_running_loop(), batch_bytes=10)
    for i in range(5):
        log.write(*sized(i))
    await log.close()
    assert [json.loads(text)["request_id"] for text in path.read_text().splitlines()] == [
        "0", "1", "2", "3", "4"]
    assert (log.written, log.dropped) == (5, 0)

    log = AccessLog(str(path), 1.0, asyncio.get_running_loop(), batch_bytes=1)
    log.write(*sized(7))
    await log.drain()
    path.rename(tmp_path / "access.log.1")  # logrotate moves it away
    log.write(*sized(8))
    await log.close()
    assert json.loads((tmp_path / "access.log.1").read_text().splitlines()[-1]) == json.loads(
        encode([entry(7)]))
    assert path.read_text().encode() == encode([entry(8)])


async def test_lines_past_the_memory_bound_are_dropped_and_counted(tmp_path: Path) -> None:
    log = AccessLog(str(tmp_path / "access.log"), 1.0, asyncio.get_running_loop(),
                    batch_bytes=1 << 20, max_pending_bytes=2 * LINE_BYTES + 100)
    for i in range(5):
        log.write(*sized(i))  # LINE_BYTES and 3 each: the first two fit, no other
    assert log.dropped == 3
    roomy = AccessLog(str(tmp_path / "other.log"), 1.0, asyncio.get_running_loop(),
                      batch_bytes=1 << 20, max_pending_bytes=10 * LINE_BYTES)
    huge = line(ts=1.0, request_id="", app="", machine="", worker="", method="GET",
                host="h", path="/" + "x" * 60_000, proto="h2", status=200, code="",
                bytes_in=0, bytes_out=0, duration_s=0.0, client="::1", cold=None)
    roomy.write(huge, LINE_BYTES + 60_001 + 1)  # counted by what its client sent: too much
    roomy.write(*sized(9))
    assert roomy.dropped == 1
    await roomy.close()
    assert (tmp_path / "other.log").read_bytes() == encode([entry(9)])
    await log.close()
    assert (tmp_path / "access.log").read_bytes() == encode([entry(0), entry(1)])


class MemoryTransport:
    def __init__(self, peer: str = "10.1.2.3") -> None:
        self.out: list[bytes] = []
        self.peer = peer

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def writelines(self, parts: list[bytes]) -> None:
        self.out.append(b"".join(parts))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return (self.peer, 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def logging_edge(path: Path) -> Edge:
    """An edge (no sockets) serving app `web` from machine m1 on worker w7, logging every
    answer to `path`."""
    from edge.service import Edge

    view = View("localhost", asyncio.get_running_loop().time)
    view.set_app("web", parse({"name": "web", "image": "x", "auto_stop": "off"}))
    view.add_started("web", "m1", "127.0.0.1:9999", worker="w7")
    return Edge(EdgeConfig(placement_url="http://127.0.0.1:9", cluster_keys=RING,
                           access_log=str(path), access_log_sample_rate=1.0), view)


async def test_a_warm_request_through_the_edge_is_logged_with_its_machine_and_bytes(
    tmp_path: Path,
) -> None:
    from edge.adapters.http1 import ClientConnection
    from edge.adapters.upstream import UpstreamConnection

    path = tmp_path / "access.log"
    edge = logging_edge(path)
    view = edge.view
    client = ClientConnection(edge)
    client.connection_made(MemoryTransport())  # type: ignore[arg-type]
    upstream = UpstreamConnection(edge.pool, view.apps["web"].machines["m1"].pool_key)
    upstream.connection_made(MemoryTransport())  # type: ignore[arg-type]
    edge.pool.release(upstream, True)

    client.data_received(REQUEST)
    upstream.data_received(RESPONSE)
    await edge.close()

    [line] = [json.loads(text) for text in path.read_text().splitlines()]
    assert line["request_id"] == "req-1" and line["app"] == "web"
    assert (line["machine"], line["worker"]) == ("m1", "w7")
    assert (line["method"], line["host"], line["path"]) == ("GET", "web.localhost", "/items/7")
    assert (line["status"], line["code"], line["proto"]) == (200, "", "http/1.1")
    assert (line["bytes_in"], line["bytes_out"], line["client"]) == (0, 5, "10.1.2.3")
    assert line["cold"] is False and "hold_ms" not in line and line["duration_ms"] >= 0


async def test_a_line_is_counted_against_the_memory_bound_with_the_target_its_client_sent(
    tmp_path: Path,
) -> None:
    """Lines wait in memory as Structs; each is counted with the target, host and request
    id its client chose, so 64 KiB targets cannot fill memory a count of lines allows."""
    from edge.adapters.http1 import ClientConnection
    from edge.adapters.upstream import UpstreamConnection

    path = tmp_path / "access.log"
    edge = logging_edge(path)
    log = edge.access_log
    assert log is not None
    log.max_pending_bytes = 2 * LINE_BYTES + 4000  # room for two short lines, not a long one
    log.batch_bytes = 1 << 20
    client = ClientConnection(edge)
    client.connection_made(MemoryTransport())  # type: ignore[arg-type]
    for target in (b"/" + b"a" * 5000, b"/short"):
        upstream = UpstreamConnection(edge.pool, edge.view.apps["web"].machines["m1"].pool_key)
        upstream.connection_made(MemoryTransport())  # type: ignore[arg-type]
        edge.pool.release(upstream, True)
        client.data_received(REQUEST.replace(b"/items/7?token=secret", target))
        upstream.data_received(RESPONSE)
    assert log.dropped == 1  # the long one: past the bound by its target alone
    await edge.close()
    [kept] = [json.loads(text) for text in path.read_text().splitlines()]
    assert kept["path"] == "/short"


async def test_requests_whose_client_went_away_are_logged_ten_a_second_and_counted(
    tmp_path: Path,
) -> None:
    """A flood of abandoned requests (reset streams, closed connections) is not a flood of
    499 lines: 20 at once (the burst), then 10 a second; the rest are counted."""
    from edge.adapters.http1 import ClientConnection

    path = tmp_path / "access.log"
    loop = asyncio.get_running_loop()
    began = loop.time()  # the bucket refills while this runs: a slow machine logs more
    edge = logging_edge(path)
    for n in range(100):  # from 100 clients (one client's would be taken 8 a turn)
        client = ClientConnection(edge)
        client.connection_made(MemoryTransport(f"10.1.0.{n}"))  # type: ignore[arg-type]
        client.data_received(REQUEST)  # forwarded (an upstream connect is under way)...
        client.connection_lost(None)  # ...and abandoned
    log = edge.access_log
    assert log is not None
    unlogged = log.gone_unlogged
    refilled = int((loop.time() - began) * GONE_LINES_PER_S)
    await edge.close()
    lines = [json.loads(text) for text in path.read_text().splitlines()]
    assert 20 <= len(lines) <= 21 + refilled and {entry["status"] for entry in lines} == {499}
    assert [entry["client"] for entry in lines] == [f"10.1.0.{n}" for n in range(len(lines))]
    assert unlogged == 100 - len(lines)


def test_any_text_a_client_sends_reads_back_from_the_line_as_sent() -> None:
    import random

    rng = random.Random(3)
    alphabet = 'ab/"\\\x00\x01\x1f\x7f é€😀\u2028'
    for _ in range(500):
        value = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        found = json.loads(text(ts=1.0, request_id=value, app="", machine="", worker="",
                                method="GET", host=value, path=value, proto="h2",
                                status=200, code="", bytes_in=0, bytes_out=0,
                                duration_s=0.001, client="::1", cold=None))
        assert found["request_id"] == found["host"] == found["path"] == value
        assert found["duration_ms"] == 1.0
