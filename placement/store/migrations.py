"""The store's schema, as an ordered list of versioned migrations applied at start.

`schema_migrations` records each version applied and when. Starting, a placement
applies in one transaction every migration the database has not had, in order; a
second placement starting at the same time against one PostgreSQL waits for the
first (`pg_advisory_xact_lock`; SQLite's BEGIN IMMEDIATE is its own lock) and then
finds nothing to do. Version 1 is the schema placement had before migrations were
versioned: its statements are `IF NOT EXISTS`, so a file made by that code (its
tables there, no schema_migrations) is adopted as version 1 with its data. A
database newer than this code knows is refused rather than written to.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from placement.store.database import Database, Tx

log = logging.getLogger("thaw.placement")
MIGRATION_LOCK = 0x7468617700000001  # pg_advisory_xact_lock key: "thaw" + 1


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sqlite: tuple[str, ...]
    postgresql: tuple[str, ...]

    def statements(self, dialect: str) -> tuple[str, ...]:
        return self.sqlite if dialect == "sqlite" else self.postgresql


def _tables(blob: str, real: str, serial: str) -> tuple[str, ...]:
    """Version 1's tables, in a dialect's words for bytes, floats and a growing key."""
    return (
        f"""CREATE TABLE IF NOT EXISTS apps (
            name    TEXT PRIMARY KEY,
            version INTEGER NOT NULL,
            config  {blob} NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS hosts (
            host TEXT PRIMARY KEY,
            app  TEXT NOT NULL)""",
        f"""CREATE TABLE IF NOT EXISTS tokens (
            id     TEXT PRIMARY KEY,
            record {blob} NOT NULL)""",
        f"""CREATE TABLE IF NOT EXISTS images (
            digest TEXT PRIMARY KEY,
            layers {blob} NOT NULL)""",
        # an app's releases, by incarnation (a new app of a deleted one's name starts at 1)
        f"""CREATE TABLE IF NOT EXISTS releases (
            uid     TEXT NOT NULL,
            version INTEGER NOT NULL,
            record  {blob} NOT NULL,
            PRIMARY KEY (uid, version))""",
        f"""CREATE TABLE IF NOT EXISTS events (
            seq    {serial},
            uid    TEXT NOT NULL,
            record {blob} NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS events_by_app ON events (uid, seq)",
        # machines lost with their worker: never counted again, destroyed once it is back
        f"""CREATE TABLE IF NOT EXISTS fenced (
            machine TEXT PRIMARY KEY,
            uid     TEXT NOT NULL,
            at      {real} NOT NULL)""",
    )


def _secrets(blob: str, real: str) -> tuple[str, ...]:
    """Version 2: apps' secrets, encrypted (never a value in clear), by incarnation."""
    return (
        f"""CREATE TABLE secrets (
            uid        TEXT NOT NULL,
            name       TEXT NOT NULL,
            ciphertext {blob} NOT NULL,
            nonce      {blob} NOT NULL,
            key_id     TEXT NOT NULL,
            digest     TEXT NOT NULL,
            created_at {real} NOT NULL,
            PRIMARY KEY (uid, name))""",
    )


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1, "apps, hosts, tokens, images, releases, events, fenced",
        sqlite=_tables("BLOB", "REAL", "INTEGER PRIMARY KEY AUTOINCREMENT"),
        postgresql=_tables("BYTEA", "DOUBLE PRECISION",
                           "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"),
    ),
    Migration(2, "secrets", sqlite=_secrets("BLOB", "REAL"),
              postgresql=_secrets("BYTEA", "DOUBLE PRECISION")),
)


class SchemaTooNew(RuntimeError):
    pass


async def migrate(database: Database, migrations: tuple[Migration, ...] = MIGRATIONS
                  ) -> list[int]:
    """Apply the migrations `database` lacks, in order, in one transaction; the versions
    applied (none: it was up to date)."""
    dialect = database.dialect.name
    async with database.transaction() as tx:
        if dialect == "postgresql":
            await tx.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await tx.execute("CREATE TABLE IF NOT EXISTS schema_migrations ("
                         "version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)")
        applied = await _applied(tx)
        known = max(m.version for m in migrations)
        if applied and max(applied) > known:
            raise SchemaTooNew(f"the store's schema is at version {max(applied)}; this "
                               f"placement knows versions up to {known}: upgrade it")
        done = []
        for migration in sorted(migrations, key=lambda m: m.version):
            if migration.version in applied:
                continue
            for statement in migration.statements(dialect):
                await tx.execute(statement)
            await tx.execute("INSERT INTO schema_migrations (version, applied_at) "
                             "VALUES ($1, $2)", migration.version,
                             time.time())
            done.append(migration.version)
    for version in done:
        log.info("store schema: migration %d applied", version)
    return done


async def _applied(tx: Tx) -> set[int]:
    return {int(row[0]) for row in await tx.rows("SELECT version FROM schema_migrations")}


async def schema_version(database: Database) -> int:
    async with database.reading() as tx:
        versions = await _applied(tx)
    return max(versions, default=0)
