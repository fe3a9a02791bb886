"""The HTTP/2 connections to h2c machines, per machine address (edge/adapters/
h2upstream.py's): the same calls as edge/adapters/upstream.py's UpstreamPool, which
makes this pool on its first h2c request."""

from __future__ import annotations

import asyncio
from typing import cast

from edge.adapters.h2upstream import ConnectionOwner, H2UpstreamConnection
from edge.exchange import Shell
from edge.view import MachineSlot


class H2Pool(ConnectionOwner):
    """HTTP/2 connections per machine address (the same calls as UpstreamPool's)."""

    def __init__(self, shell: Shell) -> None:
        self.shell = shell
        self.loop = shell.loop
        config = shell.config
        self.write_buffer_high_bytes = config.write_buffer_high_bytes
        self.idle_timeout_s = config.upstream_idle_timeout_s
        self.connect_timeout_s = config.upstream_connect_timeout_s
        self.conns: dict[str, list[H2UpstreamConnection]] = {}
        self.connecting: dict[str, asyncio.Future[H2UpstreamConnection]] = {}

    def acquire(self, address: str) -> H2UpstreamConnection | None:
        for conn in self.conns.get(address, ()):
            if conn.usable:
                return conn
        return None

    async def connect(self, slot: MachineSlot) -> H2UpstreamConnection:
        """A connection to `slot` with room for a stream: one being made is shared by
        every request that waits for it (a burst opens one connection, not one each)."""
        key = slot.pool_key
        pending = self.connecting.get(key)
        if pending is not None:
            conn = await asyncio.shield(pending)
            if conn.usable:
                return conn
        future: asyncio.Future[H2UpstreamConnection] = self.loop.create_future()
        self.connecting[key] = future
        try:
            conn = H2UpstreamConnection(self, key)
            async with asyncio.timeout(self.connect_timeout_s):
                await self.loop.create_connection(
                    lambda: cast(asyncio.Protocol, conn), slot.host, slot.port)
        except BaseException as exc:
            future.set_exception(exc if isinstance(exc, OSError | TimeoutError)
                                 else OSError(str(exc)))
            future.exception()  # retrieved: waiters that went meanwhile raise nothing
            raise
        finally:
            if self.connecting.get(key) is future:
                del self.connecting[key]
        if not conn.closed:
            self.conns.setdefault(key, []).append(conn)
        future.set_result(conn)
        return conn

    def release(self, conn: H2UpstreamConnection, reusable: bool) -> None:
        """A connection made for an exchange that ended meanwhile: it stays for others."""

    def forget(self, conn: H2UpstreamConnection) -> None:
        conns = self.conns.get(conn.address)
        if conns is not None and conn in conns:
            conns.remove(conn)
            if not conns:
                del self.conns[conn.address]

    def close_address(self, address: str) -> None:
        """The machine stops: its connections close once their streams are done."""
        for conn in list(self.conns.get(address, ())):
            conn.going_away = True
            conn._settled()

    def sever_address(self, address: str) -> None:
        for conn in list(self.conns.get(address, ())):
            conn.sever()

    def close_stale(self) -> None:
        cutoff = self.loop.time() - self.idle_timeout_s
        for conns in list(self.conns.values()):
            for conn in [c for c in conns if not c.streams and c.idle_since < cutoff]:
                conn.close()

    def close_all(self) -> None:
        for conns in list(self.conns.values()):
            for conn in list(conns):
                conn.close()
