"""A machine that speaks HTTP/2 only (an h2c app: a gRPC server) is asked if it is ready
over HTTP/2 (agent/ready.py): the gRPC health protocol's Check against a real grpcio
server, SERVING or not; and a port that is no HTTP/2 server is never ready."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.ready import GRPC_HEALTH, answers, wait_ready
from tests.support.edge_fakes import stop_process, wait_port_async
from tests.support.ports import free_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def grpc_server() -> Iterator[Callable[[dict[str, str]], int]]:
    """Start a grpcio server (tests/support/grpc_app.py) with the given environment."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str]) -> int:
        port = free_port()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.support.grpc_app"], cwd=ROOT,
            env={**os.environ, "PORT": str(port), **env},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return port

    yield start
    for proc in procs:
        stop_process(proc)


async def test_a_serving_grpc_server_is_ready_by_the_grpc_health_protocol(
        grpc_server: Callable[[dict[str, str]], int]) -> None:
    port = grpc_server({})
    result = await wait_ready(lambda: True, "127.0.0.1", port, GRPC_HEALTH, 20, h2c=True)
    assert result.ready, result


async def test_a_grpc_server_not_serving_is_not_ready(
        grpc_server: Callable[[dict[str, str]], int]) -> None:
    port = grpc_server({"THAW_TEST_NOT_SERVING": "1"})
    await wait_port_async(port, 20)
    assert await answers("127.0.0.1", port, None, 5)  # its port accepts…
    result = await wait_ready(lambda: True, "127.0.0.1", port, GRPC_HEALTH, 1.0, h2c=True)
    assert (result.ready, result.reason) == (False, "timeout")  # …but it says NOT_SERVING


async def test_a_port_that_speaks_no_http2_is_never_ready_over_h2c() -> None:
    async def http1_only(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(http1_only, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        result = await wait_ready(lambda: True, "127.0.0.1", port, "/ready", 0.5, h2c=True)
        assert (result.ready, result.reason) == (False, "timeout")
        assert await answers("127.0.0.1", port, "/ready", 2)  # over HTTP/1.1 it is ready
    finally:
        server.close()
        await server.wait_closed()
