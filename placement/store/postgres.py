"""The shared backend: PostgreSQL through an asyncpg connection pool.

Several placements can share one database: every change is one transaction on one
pooled connection, rows read to be written over are locked (`FOR UPDATE`), and
migrations take an advisory lock. Driver errors are translated here: a unique
violation is a Conflict, a server that is down or went away StoreUnavailable (503;
the pool connects again on the next call once the server is back).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
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
POOL_SIZE = 10
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

    def __init__(self, url: str) -> None:
        self.url = url
        self._pool: asyncpg.Pool | None = None

    async def open(self) -> None:
        """The pool, once the server has accepted the user (StoreRefused if not: a wrong
        password or user stops placement at start with one line)."""
        with _translated():
            self._pool = await asyncpg.create_pool(
                self.url, min_size=0, max_size=POOL_SIZE, timeout=CONNECT_TIMEOUT_S,
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

    def _connected(self) -> Any:
        if self._pool is None:
            raise RuntimeError("the store is not open")
        return self._pool.acquire(timeout=CONNECT_TIMEOUT_S)

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
