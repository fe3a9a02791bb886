"""What the SQL store needs of a database: transactions of statements, in one dialect.

The store's logic (apps.py, tokens.py, migrations.py) is written once, in SQL both
SQLite and PostgreSQL accept (numbered parameters `$1`, `ON CONFLICT`, `RETURNING`);
a backend supplies a `Database` — how to open a transaction, the few words that
differ (`Dialect`), and the translation of its driver's errors to the store's (a
unique violation is a Conflict, a lost server is StoreUnavailable).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgspec

T = TypeVar("T")
Row = Sequence[Any]


@dataclass(frozen=True)
class Dialect:
    name: str  # "sqlite" | "postgresql": which statements of a migration apply
    for_update: str  # appended to a read whose row the transaction then writes


class Tx(Protocol):
    """Statements inside one transaction (or, from `Database.reading`, one read)."""

    async def execute(self, sql: str, *args: Any) -> None: ...

    async def row(self, sql: str, *args: Any) -> Row | None: ...

    async def rows(self, sql: str, *args: Any) -> list[Row]: ...


class Database(Protocol):
    dialect: Dialect

    def transaction(self) -> AbstractAsyncContextManager[Tx]:
        """Committed when the block ends, rolled back when it raises."""
        ...

    def reading(self) -> AbstractAsyncContextManager[Tx]:
        """Reads of committed state, outside any transaction of this store."""
        ...

    async def close(self) -> None: ...


def encode(record: object) -> bytes:
    return msgspec.json.encode(record)


def decode(raw: bytes | bytearray | memoryview, kind: type[T]) -> T:
    return msgspec.json.decode(bytes(raw), type=kind)
