"""The public API's tokens, durably (placement's SQLite database): hashes, never secrets."""

from __future__ import annotations

import msgspec

from placement.adapters.store import Database
from placement.errors import NotFound
from thaw.auth.tokens import TokenRecord


class TokenStore:
    def __init__(self, database: Database) -> None:
        self._database = database
        self._db = database.db

    def get(self, token_id: str) -> TokenRecord | None:
        row = self._db.execute("SELECT record FROM tokens WHERE id = ?", (token_id,)).fetchone()
        return msgspec.json.decode(row[0], type=TokenRecord) if row else None

    def list(self) -> list[TokenRecord]:
        rows = self._db.execute("SELECT record FROM tokens ORDER BY id").fetchall()
        return [msgspec.json.decode(row[0], type=TokenRecord) for row in rows]

    def add(self, record: TokenRecord) -> None:
        with self._database.transaction():
            self._db.execute("INSERT INTO tokens (id, record) VALUES (?, ?)",
                             (record.id, msgspec.json.encode(record)))

    def revoke(self, token_id: str, at: float) -> TokenRecord:
        with self._database.transaction():
            record = self.get(token_id)
            if record is None:
                raise NotFound(f"token {token_id} not found")
            if record.revoked_at is None:
                record = msgspec.structs.replace(record, revoked_at=at)
                self._put(record)
        return record

    def revoke_scoped_to(self, app: str, at: float) -> list[str]:
        """Revoke every live token whose scope names `app` (the app is being deleted: a
        new app of the same name must not inherit its tokens). Returns their ids."""
        revoked = []
        with self._database.transaction():
            for record in self.list():
                if app in record.apps and record.revoked_at is None:
                    self._put(msgspec.structs.replace(record, revoked_at=at))
                    revoked.append(record.id)
        return revoked

    def _put(self, record: TokenRecord) -> None:
        self._db.execute("UPDATE tokens SET record = ? WHERE id = ?",
                         (msgspec.json.encode(record), record.id))
