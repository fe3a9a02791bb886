"""Is a machine's process ready: polls its port (or health path) until it answers.

Most apps boot within a second and a refused loopback connect costs microseconds, so
it polls every 2 ms for the first second, then backs off to 50 ms: readiness seen
late is boot time lost.

An app whose machines speak HTTP/2 only (`protocol = "h2c"`: gRPC servers) is asked
over HTTP/2 with prior knowledge: a GET of its health path expecting 2xx/3xx, or, for
`GRPC_HEALTH`, the gRPC health protocol's Check of the server as a whole (ready when
it answers SERVING with grpc-status 0).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import h2.config
import h2.connection
import h2.events
import h2.exceptions

FIRST_POLL_S = 0.002
MAX_POLL_S = 0.05
BACKOFF = 1.5
FAST_POLL_WINDOW_S = 1.0
PROBE_ATTEMPT_S = 1.0
GRPC_HEALTH = "/grpc.health.v1.Health/Check"
# HealthCheckRequest{service: ""} framed (uncompressed, 0 bytes); the answer
# HealthCheckResponse{status: SERVING (1)}, framed
GRPC_HEALTH_REQUEST = b"\x00\x00\x00\x00\x00"
GRPC_SERVING = b"\x00\x00\x00\x00\x02\x08\x01"


@dataclass(frozen=True)
class ReadyResult:
    ready: bool
    reason: str  # "" | "exited" | "timeout"


async def wait_ready(alive: Callable[[], bool], host: str, port: int,
                     health_path: str | None, timeout_s: float, *, h2c: bool = False
                     ) -> ReadyResult:
    """Poll host:port (TCP connect, or GET health_path expecting 2xx/3xx; over HTTP/2
    with `h2c`) while `alive()`, for at most `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    fast_until = loop.time() + FAST_POLL_WINDOW_S
    interval = FIRST_POLL_S
    while True:
        if not alive():
            return ReadyResult(False, "exited")
        remaining = deadline - loop.time()
        if remaining <= 0:
            return ReadyResult(False, "timeout")
        if await answers(host, port, health_path, min(remaining, PROBE_ATTEMPT_S),
                         h2c=h2c):
            return ReadyResult(True, "")
        await asyncio.sleep(max(0.0, min(interval, deadline - loop.time())))
        if loop.time() > fast_until:
            interval = min(interval * BACKOFF, MAX_POLL_S)


async def answers(host: str, port: int, health_path: str | None, timeout_s: float, *,
                  h2c: bool = False) -> bool:
    """One readiness attempt: connect (and GET health_path, expecting 2xx/3xx)."""
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                if health_path is None:
                    return True
                if h2c:
                    return await _h2c_answers(reader, writer, f"{host}:{port}", health_path)
                request = (
                    f"GET {health_path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                    "User-Agent: thaw-agent\r\nConnection: close\r\n\r\n"
                )
                writer.write(request.encode())
                status_line = await reader.readline()
                return 200 <= int(status_line.split()[1]) < 400
            finally:
                writer.close()
    except (OSError, ValueError, IndexError, TimeoutError, h2.exceptions.ProtocolError):
        return False


async def _h2c_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       authority: str, path: str) -> bool:
    """One request over HTTP/2 with prior knowledge: the gRPC health Check for
    GRPC_HEALTH (SERVING and grpc-status 0), else a GET expecting 2xx/3xx."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                header_encoding=None))
    conn.initiate_connection()
    grpc = path == GRPC_HEALTH
    headers = [(b":method", b"POST" if grpc else b"GET"), (b":scheme", b"http"),
               (b":path", path.encode()), (b":authority", authority.encode()),
               (b"user-agent", b"thaw-agent")]
    if grpc:
        headers += [(b"content-type", b"application/grpc"), (b"te", b"trailers")]
    conn.send_headers(1, headers, end_stream=not grpc)
    if grpc:
        conn.send_data(1, GRPC_HEALTH_REQUEST, end_stream=True)
    writer.write(conn.data_to_send())
    status, body, trailers = 0, b"", {}
    while True:
        data = await reader.read(65536)
        if not data:
            return False
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                fields = dict(event.headers)
                status = int(fields.get(b":status", b"0"))
                trailers = fields  # a trailers-only answer's status is in its head
            elif isinstance(event, h2.events.DataReceived):
                body += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.TrailersReceived):
                trailers = dict(event.headers)
            elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                if not grpc:
                    return 200 <= status < 400
                return (status == 200 and trailers.get(b"grpc-status") == b"0"
                        and body == GRPC_SERVING)
            elif isinstance(event, h2.events.ConnectionTerminated):
                return False
            if not grpc and status:  # a GET's status is its answer
                return 200 <= status < 400
        writer.write(conn.data_to_send())
