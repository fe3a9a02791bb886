"""App configs, their routed hosts, releases, events and fenced machines, in SQL.

One implementation for both backends (the `Database` they hand it). Every change of
a config bumps its `version`, so the registry (which ignores lower versions) never
goes back to an older one. Each routed host name is a row keyed by the name: two apps
can never hold one, whatever the interleaving of requests or placements, because the
database says no. A change is written only over the config it was made from: the
stored row is read `FOR UPDATE` (PostgreSQL; SQLite's writer lock serialises anyway)
and its uid and version compared, so of two changes made from one version, one wins.
"""

from __future__ import annotations

import builtins
import logging
from typing import Any

import msgspec

from ground.appconfig import AppConfig
from ground.hostnames import BadHost, normalize_host
from placement.api import AppEvent, Release
from placement.core.releases import ReleaseStatus, may_become
from placement.errors import Conflict, NotFound
from placement.store.database import Database, Tx, decode, encode
from placement.store.port import EVENTS_KEPT, HostTaken, SecretWrites, StoredSecret

log = logging.getLogger("thaw.placement")


class SqlAppStore:
    def __init__(self, database: Database) -> None:
        self._db = database
        self._for_update = database.dialect.for_update

    async def list(self) -> list[AppConfig]:
        async with self._db.reading() as tx:
            rows = await tx.rows("SELECT config FROM apps ORDER BY name")
        return [decode(row[0], AppConfig) for row in rows]

    async def get(self, name: str) -> AppConfig:
        found = await self._read_one("SELECT config FROM apps WHERE name = $1", name)
        if found is None:
            raise NotFound(f"app {name} not found")
        return decode(found, AppConfig)

    async def holds(self, name: str) -> bool:
        return await self._read_one("SELECT 1 FROM apps WHERE name = $1", name) is not None

    async def holder(self, host: str) -> str | None:
        found = await self._read_one("SELECT app FROM hosts WHERE host = $1", host)
        return None if found is None else str(found)

    async def is_current(self, config: AppConfig) -> bool:
        found = await self._read_one("SELECT config FROM apps WHERE name = $1", config.name)
        return found is not None and decode(found, AppConfig).uid == config.uid

    async def create(self, config: AppConfig, release: Release | None = None) -> AppConfig:
        stored = msgspec.structs.replace(config, version=1)
        async with self._db.transaction() as tx:
            inserted = await tx.row(
                "INSERT INTO apps (name, version, config) VALUES ($1, $2, $3) "
                "ON CONFLICT (name) DO NOTHING RETURNING name",
                stored.name, stored.version, encode(stored))
            if inserted is None:
                raise Conflict(f"app {config.name} exists", code="exists")
            await self._claim(tx, stored.name, stored.hosts)
            if release is not None:
                await self._add_release(tx, stored.uid,
                                        msgspec.structs.replace(release, config=stored))
        return stored

    async def update(self, config: AppConfig, release: Release | None = None,
                     secrets: SecretWrites | None = None) -> AppConfig:
        async with self._db.transaction() as tx:
            stored = await self._write_over(tx, config)
            await tx.execute("DELETE FROM hosts WHERE app = $1", stored.name)
            await self._claim(tx, stored.name, stored.hosts)
            if release is not None:
                await self._add_release(tx, stored.uid,
                                        msgspec.structs.replace(release, config=stored))
            if secrets is not None:
                await self._write_secrets(tx, stored.uid, secrets)
        return stored

    async def delete(self, name: str) -> None:
        async with self._db.transaction() as tx:
            found = await tx.row(f"SELECT config FROM apps WHERE name = $1{self._for_update}",
                                 name)
            if found is None:
                raise NotFound(f"app {name} not found")
            uid = decode(found[0], AppConfig).uid
            await tx.execute("DELETE FROM apps WHERE name = $1", name)
            await tx.execute("DELETE FROM hosts WHERE app = $1", name)
            for table in ("releases", "events", "fenced", "secrets"):
                await tx.execute(f"DELETE FROM {table} WHERE uid = $1", uid)

    # -- releases ----------------------------------------------------------------------

    async def releases(self, uid: str) -> builtins.list[Release]:
        async with self._db.reading() as tx:
            rows = await tx.rows("SELECT record FROM releases WHERE uid = $1 "
                                 "ORDER BY version DESC", uid)
        return [decode(row[0], Release) for row in rows]

    async def release(self, uid: str, version: int) -> Release | None:
        found = await self._read_one("SELECT record FROM releases WHERE uid = $1 AND "
                                     "version = $2", uid, version)
        return None if found is None else decode(found, Release)

    async def last_release(self, uid: str) -> int:
        found = await self._read_one("SELECT MAX(version) FROM releases WHERE uid = $1", uid)
        return int(found or 0)

    async def set_release_status(self, uid: str, version: int, status: ReleaseStatus,
                                 reason: str = "", config: AppConfig | None = None
                                 ) -> AppConfig | None:
        async with self._db.transaction() as tx:
            found = await tx.row("SELECT record FROM releases WHERE uid = $1 AND version = $2"
                                 f"{self._for_update}", uid, version)
            if found is None:
                raise NotFound(f"release {version} not found")
            was = decode(found[0], Release)
            if not may_become(was.status, status):  # (the table: nothing is written)
                log.info("release %d stays %s: not marked %s", version, was.status, status)
                return None
            changed = msgspec.structs.replace(was, status=status,
                                              reason=reason or was.reason)
            await tx.execute("UPDATE releases SET record = $1 WHERE uid = $2 AND version = $3",
                             encode(changed), uid, version)
            return None if config is None else await self._write_over(tx, config)

    # -- events, fenced machines ----------------------------------------------------------

    async def add_event(self, uid: str, event: AppEvent) -> None:
        async with self._db.transaction() as tx:
            await tx.execute("INSERT INTO events (uid, record) VALUES ($1, $2)",
                             uid, encode(event))
            await tx.execute(
                "DELETE FROM events WHERE uid = $1 AND seq <= (SELECT seq FROM events "
                "WHERE uid = $1 ORDER BY seq DESC LIMIT 1 OFFSET $2)", uid, EVENTS_KEPT)

    async def events(self, uid: str, limit: int = EVENTS_KEPT) -> builtins.list[AppEvent]:
        async with self._db.reading() as tx:
            rows = await tx.rows("SELECT record FROM events WHERE uid = $1 ORDER BY seq DESC "
                                 "LIMIT $2", uid, limit)
        return [decode(row[0], AppEvent) for row in rows]

    async def fence(self, uid: str, machine: str, at: float) -> None:
        async with self._db.transaction() as tx:
            await tx.execute("INSERT INTO fenced (machine, uid, at) VALUES ($1, $2, $3) "
                             "ON CONFLICT (machine) DO NOTHING", machine, uid, at)

    async def fenced(self, uid: str) -> frozenset[str]:
        async with self._db.reading() as tx:
            rows = await tx.rows("SELECT machine FROM fenced WHERE uid = $1", uid)
        return frozenset(str(row[0]) for row in rows)

    async def unfence(self, machine: str) -> None:
        async with self._db.transaction() as tx:
            await tx.execute("DELETE FROM fenced WHERE machine = $1", machine)

    # -- secrets (encrypted: placement/appsecrets.py) ------------------------------------

    async def secrets(self, uid: str) -> builtins.list[StoredSecret]:
        async with self._db.reading() as tx:
            rows = await tx.rows("SELECT name, ciphertext, nonce, key_id, digest, created_at "
                                 "FROM secrets WHERE uid = $1 ORDER BY name", uid)
        return [StoredSecret(str(r[0]), bytes(r[1]), bytes(r[2]), str(r[3]), str(r[4]),
                             float(r[5])) for r in rows]

    async def rewrap_secret(self, uid: str, was: StoredSecret, now: StoredSecret) -> bool:
        async with self._db.transaction() as tx:
            changed = await tx.row(
                "UPDATE secrets SET ciphertext = $1, nonce = $2, key_id = $3 WHERE uid = $4 "
                "AND name = $5 AND nonce = $6 AND key_id = $7 RETURNING name",
                now.ciphertext, now.nonce, now.key_id, uid, was.name, was.nonce, was.key_id)
        return changed is not None

    # -- inside a transaction ------------------------------------------------------------

    async def _write_secrets(self, tx: Tx, uid: str, writes: SecretWrites) -> None:
        for name in writes.drop:
            await tx.execute("DELETE FROM secrets WHERE uid = $1 AND name = $2", uid, name)
        for secret in writes.put:
            await tx.execute(
                "INSERT INTO secrets (uid, name, ciphertext, nonce, key_id, digest, created_at)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (uid, name) DO UPDATE SET "
                "ciphertext = excluded.ciphertext, nonce = excluded.nonce, "
                "key_id = excluded.key_id, digest = excluded.digest, "
                "created_at = excluded.created_at",
                uid, secret.name, secret.ciphertext, secret.nonce, secret.key_id,
                secret.digest, secret.created_at)

    async def _write_over(self, tx: Tx, config: AppConfig) -> AppConfig:
        found = await tx.row(f"SELECT config FROM apps WHERE name = $1{self._for_update}",
                             config.name)
        if found is None:
            raise NotFound(f"app {config.name} not found")
        was = decode(found[0], AppConfig)
        if (was.uid, was.version) != (config.uid, config.version):
            raise Conflict(f"app {config.name} changed meanwhile; retry", code="conflict")
        stored = msgspec.structs.replace(config, version=was.version + 1)
        await tx.execute("UPDATE apps SET version = $1, config = $2 WHERE name = $3",
                         stored.version, encode(stored), stored.name)
        return stored

    async def _add_release(self, tx: Tx, uid: str, release: Release) -> None:
        inserted = await tx.row(
            "INSERT INTO releases (uid, version, record) VALUES ($1, $2, $3) "
            "ON CONFLICT (uid, version) DO NOTHING RETURNING version",
            uid, release.version, encode(release))
        if inserted is None:
            raise Conflict(f"release {release.version} of {release.app} exists",
                           code="conflict")

    async def _claim(self, tx: Tx, app: str, hosts: builtins.list[str]) -> None:
        """Take `hosts` for `app`, or raise HostTaken naming the holder (the transaction
        is rolled back: nothing of the change is kept)."""
        for host in hosts:
            inserted = await tx.row("INSERT INTO hosts (host, app) VALUES ($1, $2) "
                                    "ON CONFLICT (host) DO NOTHING RETURNING host", host, app)
            if inserted is None:
                holder = await tx.row("SELECT app FROM hosts WHERE host = $1", host)
                raise HostTaken(host, str(holder[0]) if holder else "")

    async def _read_one(self, sql: str, *args: Any) -> Any:
        """The first column of the first row, or None."""
        async with self._db.reading() as tx:
            found = await tx.row(sql, *args)
        return None if found is None else found[0]

    async def index_hosts(self) -> None:
        """A store written before hosts were owned: index them now, normalised as new ones
        are; the first app (by name) keeps a name two apps listed (the other loses it in
        the index, and is told in the log); a name that is no host name is skipped."""
        async with self._db.transaction() as tx:
            if await tx.row("SELECT 1 FROM hosts LIMIT 1") is not None:
                return
            for row in await tx.rows("SELECT config FROM apps ORDER BY name"):
                config = decode(row[0], AppConfig)
                for listed in config.hosts:
                    try:
                        host = normalize_host(listed)
                    except BadHost as exc:
                        log.warning("app %s lists a host that is no host name: %s",
                                    config.name, exc)
                        continue
                    inserted = await tx.row(
                        "INSERT INTO hosts (host, app) VALUES ($1, $2) "
                        "ON CONFLICT (host) DO NOTHING RETURNING host", host, config.name)
                    if inserted is None:
                        log.warning("host %s is listed by %s and another app; %s loses it",
                                    host, config.name, config.name)
