"""Egress test aids: a socket that counts connections, and a DNS stand-in."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest


class Trap:
    """A listening socket that counts the connections it accepts."""

    def __init__(self, host: str, port: int = 0) -> None:
        self.host = host
        self.port = port
        self.accepted = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Trap:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    def _accept(self, _: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        writer.close()

    async def assert_untouched(self) -> None:
        """No connection arrived; then prove the trap would have seen one."""
        await asyncio.sleep(0.05)  # let a connection that was already on its way land
        assert self.accepted == 0
        _, writer = await asyncio.open_connection(self.host, self.port)
        writer.close()
        for _ in range(200):
            if self.accepted:
                break
            await asyncio.sleep(0.01)
        assert self.accepted == 1


class StubLookup:
    """A DNS stand-in: name -> addresses; records every question."""

    def __init__(self, names: dict[str, list[str]] | None = None) -> None:
        self.names = names or {}
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        if host not in self.names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.names[host]


@pytest.fixture
async def trap() -> AsyncIterator[Trap]:
    """A counting socket on 127.0.0.1 (a free port)."""
    async with Trap("127.0.0.1") as running:
        yield running


@pytest.fixture
async def trap6(trap: Trap) -> AsyncIterator[Trap]:
    """A counting socket on ::1, on the same port as `trap`."""
    async with Trap("::1", trap.port) as running:
        yield running
