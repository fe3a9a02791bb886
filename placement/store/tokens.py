"""The API's tokens and the pinned images' layer lists, in SQL (both backends)."""

from __future__ import annotations

import builtins

import msgspec

from ground.auth.tokens import TokenRecord
from placement.errors import NotFound
from placement.store.database import Database, Tx, decode, encode


class SqlTokenStore:
    """Hashes, never secrets (ground/auth/tokens.py)."""

    def __init__(self, database: Database) -> None:
        self._db = database
        self._for_update = database.dialect.for_update

    async def get(self, token_id: str) -> TokenRecord | None:
        async with self._db.reading() as tx:
            found = await tx.row("SELECT record FROM tokens WHERE id = $1", token_id)
        return None if found is None else decode(found[0], TokenRecord)

    async def list(self) -> list[TokenRecord]:
        async with self._db.reading() as tx:
            rows = await tx.rows("SELECT record FROM tokens ORDER BY id")
        return [decode(row[0], TokenRecord) for row in rows]

    async def add(self, record: TokenRecord) -> None:
        async with self._db.transaction() as tx:
            await tx.execute("INSERT INTO tokens (id, record) VALUES ($1, $2)",
                             record.id, encode(record))

    async def revoke(self, token_id: str, at: float) -> TokenRecord:
        async with self._db.transaction() as tx:
            found = await tx.row(f"SELECT record FROM tokens WHERE id = $1{self._for_update}",
                                 token_id)
            if found is None:
                raise NotFound(f"token {token_id} not found")
            record = decode(found[0], TokenRecord)
            if record.revoked_at is None:
                record = msgspec.structs.replace(record, revoked_at=at)
                await _put(tx, record)
        return record

    async def revoke_scoped_to(self, app: str, at: float) -> builtins.list[str]:
        """The app is being deleted: a new app of the same name must not inherit its
        tokens."""
        revoked = []
        async with self._db.transaction() as tx:
            rows = await tx.rows(f"SELECT record FROM tokens ORDER BY id{self._for_update}")
            for row in rows:
                record = decode(row[0], TokenRecord)
                if app in record.apps and record.revoked_at is None:
                    await _put(tx, msgspec.structs.replace(record, revoked_at=at))
                    revoked.append(record.id)
        return revoked


async def _put(tx: Tx, record: TokenRecord) -> None:
    await tx.execute("UPDATE tokens SET record = $1 WHERE id = $2", encode(record), record.id)


class SqlImageStore:
    """Placement scores workers by a pinned image's layers without asking a registry on a
    wake, also after a restart."""

    def __init__(self, database: Database) -> None:
        self._db = database

    async def layers(self, digest: str) -> dict[str, int] | None:
        async with self._db.reading() as tx:
            found = await tx.row("SELECT layers FROM images WHERE digest = $1", digest)
        return None if found is None else decode(found[0], dict[str, int])

    async def keep(self, digest: str, layers: dict[str, int]) -> None:
        async with self._db.transaction() as tx:
            await tx.execute("INSERT INTO images (digest, layers) VALUES ($1, $2) "
                             "ON CONFLICT (digest) DO UPDATE SET layers = excluded.layers",
                             digest, encode(layers))
