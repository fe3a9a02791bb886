"""Is a machine's process ready: polls its port (or health path) until it answers.

Most apps boot within a second and a refused loopback connect costs microseconds, so
it polls every 2 ms for the first second, then backs off to 50 ms: readiness seen
late is boot time lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

FIRST_POLL_S = 0.002
MAX_POLL_S = 0.05
BACKOFF = 1.5
FAST_POLL_WINDOW_S = 1.0
PROBE_ATTEMPT_S = 1.0


@dataclass(frozen=True)
class ReadyResult:
    ready: bool
    reason: str  # "" | "exited" | "timeout"


async def wait_ready(alive: Callable[[], bool], host: str, port: int,
                     health_path: str | None, timeout_s: float) -> ReadyResult:
    """Poll host:port (TCP connect, or GET health_path expecting 2xx/3xx) while `alive()`,
    for at most `timeout_s`."""
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
        if await answers(host, port, health_path, min(remaining, PROBE_ATTEMPT_S)):
            return ReadyResult(True, "")
        await asyncio.sleep(max(0.0, min(interval, deadline - loop.time())))
        if loop.time() > fast_until:
            interval = min(interval * BACKOFF, MAX_POLL_S)


async def answers(host: str, port: int, health_path: str | None, timeout_s: float) -> bool:
    """One readiness attempt: connect (and GET health_path, expecting 2xx/3xx)."""
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                if health_path is None:
                    return True
                request = (
                    f"GET {health_path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                    "User-Agent: thaw-agent\r\nConnection: close\r\n\r\n"
                )
                writer.write(request.encode())
                status_line = await reader.readline()
                return 200 <= int(status_line.split()[1]) < 400
            finally:
                writer.close()
    except (OSError, ValueError, IndexError):
        return False
