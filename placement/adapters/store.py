"""Placement's durable state: one SQLite file (WAL), one transaction per change.

Placement's store is the truth for app configs, the host names they route and the
API's tokens; the registry holds a copy of the configs. Every change of a config
bumps its `version`, so the registry (which ignores lower versions) never goes back
to an older one. Each routed host name is a row keyed by the name: two apps can
never hold one, whatever the interleaving of requests, because the database says no.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import msgspec

from placement.api import AppEvent, Release
from placement.errors import Conflict, NotFound
from thaw.appconfig import AppConfig
from thaw.hostnames import BadHost, normalize_host

log = logging.getLogger("thaw.placement")

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS apps (
        name    TEXT PRIMARY KEY,
        version INTEGER NOT NULL,
        config  BLOB NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS hosts (
        host TEXT PRIMARY KEY,
        app  TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS tokens (
        id     TEXT PRIMARY KEY,
        record BLOB NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS images (
        digest TEXT PRIMARY KEY,
        layers BLOB NOT NULL)""",
    # an app's releases, by incarnation (a new app of a deleted one's name starts at 1)
    """CREATE TABLE IF NOT EXISTS releases (
        uid     TEXT NOT NULL,
        version INTEGER NOT NULL,
        record  BLOB NOT NULL,
        PRIMARY KEY (uid, version))""",
    """CREATE TABLE IF NOT EXISTS events (
        seq    INTEGER PRIMARY KEY AUTOINCREMENT,
        uid    TEXT NOT NULL,
        record BLOB NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS events_by_app ON events (uid, seq)",
    # machines lost with their worker: never counted again, destroyed once it is back
    """CREATE TABLE IF NOT EXISTS fenced (
        machine TEXT PRIMARY KEY,
        uid     TEXT NOT NULL,
        at      REAL NOT NULL)""",
)
EVENTS_KEPT = 500  # per app


class HostTaken(Conflict):
    """A routed name another app holds; the API shows the holder only to who may see it."""

    code = "host_taken"

    def __init__(self, host: str, holder: str) -> None:
        super().__init__(f"host {host} is taken")
        self.host = host
        self.holder = holder


class Database:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        for statement in SCHEMA:
            self.db.execute(statement)

    def close(self) -> None:
        self.db.close()

    def transaction(self) -> _Transaction:
        return _Transaction(self.db)


class AppStore:
    def __init__(self, database: Database) -> None:
        self._database = database
        self._db = database.db
        self._index_hosts()

    def list(self) -> list[AppConfig]:
        rows = self._db.execute("SELECT config FROM apps ORDER BY name").fetchall()
        return [msgspec.json.decode(row[0], type=AppConfig) for row in rows]

    def get(self, name: str) -> AppConfig:
        row = self._db.execute("SELECT config FROM apps WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"app {name} not found")
        return msgspec.json.decode(row[0], type=AppConfig)

    def holds(self, name: str) -> bool:
        return self._db.execute("SELECT 1 FROM apps WHERE name = ?", (name,)).fetchone() \
            is not None

    def holder(self, host: str) -> str | None:
        row = self._db.execute("SELECT app FROM hosts WHERE host = ?", (host,)).fetchone()
        return str(row[0]) if row else None

    def create(self, config: AppConfig, release: Release | None = None) -> AppConfig:
        """Store a new app (version 1) and, in the same transaction, its first release."""
        stored = msgspec.structs.replace(config, version=1)
        with self._database.transaction():
            try:
                self._db.execute(
                    "INSERT INTO apps (name, version, config) VALUES (?, ?, ?)",
                    (stored.name, stored.version, msgspec.json.encode(stored)),
                )
            except sqlite3.IntegrityError:
                raise Conflict(f"app {config.name} exists", code="exists") from None
            self._claim(stored.name, stored.hosts)
            if release is not None:
                self._add_release(stored.uid, msgspec.structs.replace(release, config=stored))
        return stored

    def is_current(self, config: AppConfig) -> bool:
        """`config`'s app still exists, as the same incarnation (not deleted, not re-made)."""
        row = self._db.execute("SELECT config FROM apps WHERE name = ?",
                               (config.name,)).fetchone()
        return row is not None and msgspec.json.decode(row[0], type=AppConfig).uid == config.uid

    def update(self, config: AppConfig, release: Release | None = None) -> AppConfig:
        """Replace the stored config, which must still be the one `config` was made from
        (same uid and version: no change came between); the version becomes + 1. A
        `release` made from it is added in the same transaction."""
        with self._database.transaction():
            stored = self._write_over(config)
            self._db.execute("DELETE FROM hosts WHERE app = ?", (stored.name,))
            self._claim(stored.name, stored.hosts)
            if release is not None:
                self._add_release(stored.uid, msgspec.structs.replace(release, config=stored))
        return stored

    # -- releases, events, fenced machines (by the app's incarnation) ------------------

    def _add_release(self, uid: str, release: Release) -> None:
        try:
            self._db.execute("INSERT INTO releases (uid, version, record) VALUES (?, ?, ?)",
                             (uid, release.version, msgspec.json.encode(release)))
        except sqlite3.IntegrityError:
            raise Conflict(f"release {release.version} of {release.app} exists",
                           code="conflict") from None

    def releases(self, uid: str) -> list[Release]:
        """Newest first."""
        rows = self._db.execute("SELECT record FROM releases WHERE uid = ? ORDER BY version "
                                "DESC", (uid,)).fetchall()
        return [msgspec.json.decode(row[0], type=Release) for row in rows]

    def release(self, uid: str, version: int) -> Release | None:
        row = self._db.execute("SELECT record FROM releases WHERE uid = ? AND version = ?",
                               (uid, version)).fetchone()
        return None if row is None else msgspec.json.decode(row[0], type=Release)

    def last_release(self, uid: str) -> int:
        row = self._db.execute("SELECT MAX(version) FROM releases WHERE uid = ?",
                               (uid,)).fetchone()
        return int(row[0] or 0)

    def set_release_status(self, uid: str, version: int, status: str, reason: str = "",
                           config: AppConfig | None = None) -> AppConfig | None:
        """Mark a release's status; with `config`, also store that config (written over the
        one it was made from, as `update`) in the same transaction, and return it."""
        with self._database.transaction():
            found = self.release(uid, version)
            if found is None:
                raise NotFound(f"release {version} not found")
            changed = msgspec.structs.replace(found, status=status,  # type: ignore[arg-type]
                                              reason=reason or found.reason)
            self._db.execute("UPDATE releases SET record = ? WHERE uid = ? AND version = ?",
                             (msgspec.json.encode(changed), uid, version))
            if config is None:
                return None
            return self._write_over(config)

    def _write_over(self, config: AppConfig) -> AppConfig:
        row = self._db.execute("SELECT config FROM apps WHERE name = ?",
                               (config.name,)).fetchone()
        if row is None:
            raise NotFound(f"app {config.name} not found")
        found = msgspec.json.decode(row[0], type=AppConfig)
        if (found.uid, found.version) != (config.uid, config.version):
            raise Conflict(f"app {config.name} changed meanwhile; retry", code="conflict")
        stored = msgspec.structs.replace(config, version=found.version + 1)
        self._db.execute("UPDATE apps SET version = ?, config = ? WHERE name = ?",
                         (stored.version, msgspec.json.encode(stored), stored.name))
        return stored

    def add_event(self, uid: str, event: AppEvent) -> None:
        with self._database.transaction():
            cursor = self._db.execute("INSERT INTO events (uid, record) VALUES (?, ?)",
                                      (uid, msgspec.json.encode(event)))
            self._db.execute("DELETE FROM events WHERE uid = ? AND seq <= ?",
                             (uid, (cursor.lastrowid or 0) - EVENTS_KEPT))

    def events(self, uid: str, limit: int = EVENTS_KEPT) -> list[AppEvent]:
        """Newest first."""
        rows = self._db.execute("SELECT record FROM events WHERE uid = ? ORDER BY seq DESC "
                                "LIMIT ?", (uid, limit)).fetchall()
        return [msgspec.json.decode(row[0], type=AppEvent) for row in rows]

    def fence(self, uid: str, machine: str, at: float) -> None:
        with self._database.transaction():
            self._db.execute("INSERT OR IGNORE INTO fenced (machine, uid, at) VALUES (?, ?, ?)",
                             (machine, uid, at))

    def fenced(self, uid: str) -> frozenset[str]:
        rows = self._db.execute("SELECT machine FROM fenced WHERE uid = ?", (uid,)).fetchall()
        return frozenset(str(row[0]) for row in rows)

    def unfence(self, machine: str) -> None:
        with self._database.transaction():
            self._db.execute("DELETE FROM fenced WHERE machine = ?", (machine,))

    def delete(self, name: str) -> None:
        with self._database.transaction():
            row = self._db.execute("SELECT config FROM apps WHERE name = ?",
                                   (name,)).fetchone()
            if row is None:
                raise NotFound(f"app {name} not found")
            uid = msgspec.json.decode(row[0], type=AppConfig).uid
            self._db.execute("DELETE FROM apps WHERE name = ?", (name,))
            self._db.execute("DELETE FROM hosts WHERE app = ?", (name,))
            for table in ("releases", "events", "fenced"):
                self._db.execute(f"DELETE FROM {table} WHERE uid = ?", (uid,))

    def _claim(self, app: str, hosts: list[str]) -> None:
        """Inside a transaction: take `hosts` for `app`, or raise (rolling it all back)."""
        for host in hosts:
            try:
                self._db.execute("INSERT INTO hosts (host, app) VALUES (?, ?)", (host, app))
            except sqlite3.IntegrityError:
                raise HostTaken(host, self.holder(host) or "") from None

    def _index_hosts(self) -> None:
        """A store written before hosts were owned: index them now, normalised as new ones
        are; the first app (by name) keeps a name two apps listed (the other loses it in
        the index, and is told in the log); a name that is no host name is skipped."""
        with self._database.transaction():
            if self._db.execute("SELECT 1 FROM hosts LIMIT 1").fetchone() is not None:
                return
            for config in self.list():
                for listed in config.hosts:
                    try:
                        host = normalize_host(listed)
                    except BadHost as exc:
                        log.warning("app %s lists a host that is no host name: %s",
                                    config.name, exc)
                        continue
                    inserted = self._db.execute(
                        "INSERT OR IGNORE INTO hosts (host, app) VALUES (?, ?)",
                        (host, config.name),
                    )
                    if inserted.rowcount == 0:
                        log.warning("host %s is listed by %s and another app; %s loses it",
                                    host, config.name, config.name)


class ImageStore:
    """The layer list (digest -> compressed bytes) of every image pinned at create or
    deploy, by manifest digest: placement scores workers by it without asking a registry
    on a wake, also after a restart."""

    def __init__(self, database: Database) -> None:
        self._database = database
        self._db = database.db

    def layers(self, digest: str) -> dict[str, int] | None:
        row = self._db.execute("SELECT layers FROM images WHERE digest = ?",
                               (digest,)).fetchone()
        return msgspec.json.decode(row[0], type=dict[str, int]) if row else None

    def keep(self, digest: str, layers: dict[str, int]) -> None:
        with self._database.transaction():
            self._db.execute("INSERT OR REPLACE INTO images (digest, layers) VALUES (?, ?)",
                             (digest, msgspec.json.encode(layers)))


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK when the block raises."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, value: object, traceback: object) -> None:
        self._db.execute("COMMIT" if kind is None else "ROLLBACK")
