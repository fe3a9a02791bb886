"""A real redis-server on a free port, started and killed (by PID) by the tests."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis.asyncio as redis

from tests.support.ports import free_port, wait_for_port


@dataclass(frozen=True)
class RedisServer:
    port: int
    pid: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def flushed(self) -> str:
        """Its URL, every key deleted first (a session's server, fresh for one test)."""
        client = redis.Redis.from_url(self.url)
        await client.flushall()
        await client.aclose()
        return self.url


@contextlib.contextmanager
def start_redis_server(port: int | None = None) -> Iterator[RedisServer]:
    """`port`: where to listen (a free one unless given: a Redis restarted in place)."""
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    workdir = tempfile.mkdtemp(prefix="thaw-redis-")
    port = port or free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir, "--enable-debug-command", "local", "--logfile", ""],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port("127.0.0.1", port, timeout_s=10)
        yield RedisServer(port, proc.pid)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with start_redis_server() as server:
        yield server
