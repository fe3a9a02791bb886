"""The shared backend: PostgreSQL through an asyncpg connection pool.

Several placements can share one database: every change is one transaction on one
pooled connection, rows read to be written over are locked (`FOR UPDATE`), and
migrations take an advisory lock. Driver errors are translated here: a unique
violation is a Conflict, a server that is down or went away StoreUnavailable (503;
the pool connects again on the next call once the server is back).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any
from urllib.parse import unquote, urlsplit

import asyncpg

from placement.errors import Conflict
from placement.store.database import Dialect, Row
from placement.store.port import StoreUnavailable


class StoreRefused(ValueError):
    """The server refused placement's user: a wrong password or user, or no access."""

POSTGRESQL = Dialect(name="postgresql", for_update=" FOR UPDATE")
CONNECT_TIMEOUT_S = 5.0
STATEMENT_TIMEOUT_S = 10.0
# Connections per placement. 10 ran dry in a herd of 100 cold wakes at 2,000 apps (issue
# 25); a caller beyond waits for one up to ACQUIRE_TIMEOUT_S (within a wake's budget)
# rather than fail. Two placements at 32 stay well under PostgreSQL's 100 connections.
POOL_SIZE = 32
ACQUIRE_TIMEOUT_S = 10.0
LOST = (OSError, TimeoutError, asyncpg.InterfaceError,
        asyncpg.PostgresConnectionError, asyncpg.exceptions.OperatorInterventionError)


class PostgresTx:
    def __init__(self, connection: Any) -> None:
        self._connection = connection

    async def execute(self, sql: str, *args: Any) -> None:
        with _translated():
            await self._connection.execute(sql, *args)

    async def row(self, sql: str, *args: Any) -> Row | None:
        with _translated():
            found: Row | None = await self._connection.fetchrow(sql, *args)
        return found

    async def rows(self, sql: str, *args: Any) -> list[Row]:
        with _translated():
            return list(await self._connection.fetch(sql, *args))


class PostgresDatabase:
    dialect = POSTGRESQL

    def __init__(self, url: str, pool_size: int = POOL_SIZE,
                 on_wait: Callable[[float], None] | None = None) -> None:
        """`on_wait(seconds)`: a call found every pooled connection in use and waited."""
        if pool_size < 1:
            raise ValueError("the store's pool size must be >= 1")
        self.url = url
        self.pool_size = pool_size
        self.on_wait = on_wait
        self._pool: asyncpg.Pool | None = None

    async def open(self) -> None:
        """The pool, once the server has accepted the user (StoreRefused if not: a wrong
        password or user stops placement at start with one line)."""
        with _translated():
            self._pool = await asyncpg.create_pool(
                self.url, min_size=0, max_size=self.pool_size, timeout=CONNECT_TIMEOUT_S,
                command_timeout=STATEMENT_TIMEOUT_S)
        try:
            async with self.reading() as tx:
                await tx.row("SELECT 1")
        except asyncpg.InvalidAuthorizationSpecificationError as exc:
            await self.close()
            parts = urlsplit(self.url)
            raise StoreRefused(f"postgresql at {parts.hostname}:{parts.port or 5432} "
                               f"refused user {unquote(parts.username or '')!r}: "
                               f"{exc}") from None

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[PostgresTx]:
        with _translated():
            async with self._connected() as connection, connection.transaction():
                yield PostgresTx(connection)

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[PostgresTx]:
        with _translated():
            async with self._connected() as connection:
                yield PostgresTx(connection)

    @asynccontextmanager
    async def _connected(self) -> AsyncIterator[Any]:
        pool = self._pool
        if pool is None:
            raise RuntimeError("the store is not open")
        busy = pool.get_idle_size() == 0 and pool.get_size() >= self.pool_size
        began = time.monotonic()
        try:
            connection = await pool.acquire(timeout=ACQUIRE_TIMEOUT_S)
        finally:
            if busy and self.on_wait is not None:
                self.on_wait(time.monotonic() - began)
        try:
            yield connection
        finally:
            await pool.release(connection)

    async def close(self) -> None:
        if self._pool is not None:
            try:
                await asyncio.wait_for(self._pool.close(), CONNECT_TIMEOUT_S)
            except LOST:  # TimeoutError is among them
                self._pool.terminate()


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except asyncpg.UniqueViolationError as exc:
        raise Conflict(f"conflicting write: {exc.detail or exc}", code="conflict") from None
    except LOST as exc:
        raise StoreUnavailable(f"{type(exc).__name__}: {exc}" if str(exc)
                               else type(exc).__name__) from exc
