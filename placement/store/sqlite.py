"""The embedded backend: one SQLite file (WAL, synchronous=FULL) in the state dir.

Local and fast, so its statements run synchronously inside the async methods; an
asyncio lock keeps one transaction at a time on the one connection (BEGIN IMMEDIATE
takes the file's writer lock against other processes). Driver errors are translated
here: a constraint violation is a Conflict, an unusable file StoreUnavailable.
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from ground.statefiles import open_private, private_dir, tighten
from placement.errors import Conflict
from placement.store.database import Dialect, Row
from placement.store.port import StoreUnavailable

SQLITE = Dialect(name="sqlite", for_update="")
_NUMBERED = re.compile(r"\$(\d+)")


def sqlite_sql(sql: str) -> str:
    """`$1` (PostgreSQL's numbered parameter) as SQLite writes it, `?1`."""
    return _NUMBERED.sub(r"?\1", sql)


class SQLiteTx:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    async def execute(self, sql: str, *args: Any) -> None:
        with _translated():
            self._connection.execute(sqlite_sql(sql), args)

    async def row(self, sql: str, *args: Any) -> Row | None:
        with _translated():
            found: Row | None = self._connection.execute(sqlite_sql(sql), args).fetchone()
        return found

    async def rows(self, sql: str, *args: Any) -> list[Row]:
        with _translated():
            return self._connection.execute(sqlite_sql(sql), args).fetchall()


class SQLiteDatabase:
    dialect = SQLITE

    def __init__(self, path: Path) -> None:
        private_dir(path.parent)
        # SQLite makes -wal and -shm with the database's mode: 0600, made here first.
        os.close(open_private(path, os.O_RDWR))
        tighten(*(path.with_name(path.name + end) for end in ("-wal", "-shm")))
        with _translated():
            self._connection = sqlite3.connect(path, isolation_level=None,
                                               check_same_thread=False)
            self._connection.execute("PRAGMA journal_mode=WAL")
            self._connection.execute("PRAGMA synchronous=FULL")
        self._tx = SQLiteTx(self._connection)
        self._lock = asyncio.Lock()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[SQLiteTx]:
        async with self._lock:
            with _translated():
                self._connection.execute("BEGIN IMMEDIATE")
            try:
                yield self._tx
                with _translated():
                    self._connection.execute("COMMIT")
            except BaseException:
                if self._connection.in_transaction:
                    self._connection.execute("ROLLBACK")
                raise

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[SQLiteTx]:
        async with self._lock:
            yield self._tx

    async def close(self) -> None:
        self._connection.close()


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except sqlite3.IntegrityError as exc:
        raise Conflict(f"conflicting write: {exc}", code="conflict") from None
    except sqlite3.Error as exc:  # locked past the busy timeout, disk full, unreadable
        raise StoreUnavailable(str(exc)) from exc
