"""App configs, durably: one SQLite file (WAL), one transaction per change.

Placement's store is the truth for app configs; the registry holds a copy. Every
change bumps the config's `version`, so the registry (which ignores lower
versions) never goes back to an older config.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec

from placement.errors import Conflict, NotFound
from thaw.appconfig import AppConfig

SCHEMA = """
CREATE TABLE IF NOT EXISTS apps (
    name    TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    config  BLOB NOT NULL
)
"""


class AppStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(SCHEMA)

    def close(self) -> None:
        self._db.close()

    def list(self) -> list[AppConfig]:
        rows = self._db.execute("SELECT config FROM apps ORDER BY name").fetchall()
        return [msgspec.json.decode(row[0], type=AppConfig) for row in rows]

    def get(self, name: str) -> AppConfig:
        row = self._db.execute("SELECT config FROM apps WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"app {name} not found")
        return msgspec.json.decode(row[0], type=AppConfig)

    def create(self, config: AppConfig) -> AppConfig:
        stored = msgspec.structs.replace(config, version=1)
        try:
            with self._transaction():
                self._db.execute(
                    "INSERT INTO apps (name, version, config) VALUES (?, ?, ?)",
                    (stored.name, stored.version, msgspec.json.encode(stored)),
                )
        except sqlite3.IntegrityError:
            raise Conflict(f"app {config.name} exists", code="exists") from None
        return stored

    def update(self, config: AppConfig) -> AppConfig:
        """Replace the stored config; the version becomes the stored one + 1."""
        with self._transaction():
            row = self._db.execute(
                "SELECT version FROM apps WHERE name = ?", (config.name,)
            ).fetchone()
            if row is None:
                raise NotFound(f"app {config.name} not found")
            stored = msgspec.structs.replace(config, version=int(row[0]) + 1)
            self._db.execute(
                "UPDATE apps SET version = ?, config = ? WHERE name = ?",
                (stored.version, msgspec.json.encode(stored), stored.name),
            )
        return stored

    def delete(self, name: str) -> None:
        with self._transaction():
            cursor = self._db.execute("DELETE FROM apps WHERE name = ?", (name,))
            if cursor.rowcount == 0:
                raise NotFound(f"app {name} not found")

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK when the block raises."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, value: object, traceback: object) -> None:
        self._db.execute("COMMIT" if kind is None else "ROLLBACK")
