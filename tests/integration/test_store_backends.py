"""What only one backend has to show: SQLite adopts a file made before migrations were
versioned; PostgreSQL survives being killed, and two placements migrating it at once."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from ground.appconfig import AppConfig
from ground.auth.tokens import TokenRecord
from placement.config import PlacementConfig
from placement.errors import Unavailable
from placement.store import StoreUnavailable, check_store_url, open_store
from placement.store.migrations import schema_version
from tests.support.credentials import RING
from tests.support.postgres import PostgresServer, postgres_server, postgres_url, running_postgres

__all__ = ["postgres_server", "postgres_url"]  # fixtures

# the schema placement had before migrations were versioned (no schema_migrations)
UNVERSIONED = (
    "CREATE TABLE apps (name TEXT PRIMARY KEY, version INTEGER NOT NULL, config BLOB NOT NULL)",
    "CREATE TABLE hosts (host TEXT PRIMARY KEY, app TEXT NOT NULL)",
    "CREATE TABLE tokens (id TEXT PRIMARY KEY, record BLOB NOT NULL)",
    "CREATE TABLE images (digest TEXT PRIMARY KEY, layers BLOB NOT NULL)",
    "CREATE TABLE releases (uid TEXT NOT NULL, version INTEGER NOT NULL, record BLOB NOT NULL,"
    " PRIMARY KEY (uid, version))",
    "CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, uid TEXT NOT NULL,"
    " record BLOB NOT NULL)",
    "CREATE INDEX events_by_app ON events (uid, seq)",
    "CREATE TABLE fenced (machine TEXT PRIMARY KEY, uid TEXT NOT NULL, at REAL NOT NULL)",
)


def hello(name: str = "hello", **fields: object) -> AppConfig:
    return AppConfig(name=name, image="registry.test/hello:1", uid="00000000000000a1",
                     **fields)  # type: ignore[arg-type]


async def test_a_sqlite_file_made_before_versioned_migrations_is_adopted_with_its_data(
    tmp_path: Path,
) -> None:
    old = msgspec.structs.replace(hello(hosts=["www.hello.test"]), version=3)
    record = TokenRecord(id="t1", hash="h", admin=True, apps=[], name="ops", created_at=1.0)
    with sqlite3.connect(tmp_path / "apps.sqlite3") as db:
        for statement in UNVERSIONED:
            db.execute(statement)
        db.execute("INSERT INTO apps VALUES (?, ?, ?)", ("hello", 3, msgspec.json.encode(old)))
        db.execute("INSERT INTO tokens VALUES (?, ?)", ("t1", msgspec.json.encode(record)))
        db.execute("INSERT INTO fenced VALUES (?, ?, ?)", ("m1", old.uid, 1.0))
    db.close()
    store = await open_store("sqlite", tmp_path)
    try:
        assert await schema_version(store.database) == 2  # adopted as 1, then migrated
        assert await store.apps.get("hello") == old
        assert await store.apps.holder("www.hello.test") == "hello"  # hosts indexed
        assert await store.tokens.get("t1") == record
        assert await store.apps.fenced(old.uid) == {"m1"}
        assert (await store.apps.update(old)).version == 4
    finally:
        await store.close()


async def test_two_placements_starting_at_once_migrate_one_postgres_once(
    postgres_url: str, tmp_path: Path,
) -> None:
    stores = await asyncio.gather(*(open_store(postgres_url, tmp_path) for _ in range(4)))
    try:
        async with stores[0].database.reading() as tx:
            rows = await tx.rows("SELECT version FROM schema_migrations ORDER BY version")
        assert [tuple(r) for r in rows] == [(1,), (2,)]
        await stores[1].apps.create(hello())
        assert await stores[3].apps.holds("hello")
    finally:
        for store in stores:
            await store.close()


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server of this test's own, to kill."""
    with running_postgres() as server:
        yield server


async def test_a_killed_postgres_is_unavailable_then_serves_again_after_a_restart(
    own_postgres: PostgresServer, tmp_path: Path,
) -> None:
    store = await open_store(own_postgres.url(), tmp_path)
    try:
        created = await store.apps.create(hello())
        own_postgres.kill()  # kill -9, the pool's connections with it
        for call in (store.apps.get("hello"), store.apps.create(hello("other")),
                     store.tokens.list()):
            with pytest.raises(StoreUnavailable) as caught:
                await asyncio.wait_for(call, 20)
            assert isinstance(caught.value, Unavailable) and caught.value.status == 503
            assert "store is unavailable" in caught.value.message
        own_postgres.restart()
        assert await store.apps.get("hello") == created
        await store.apps.create(hello("other"))
        assert [c.name for c in await store.apps.list()] == ["hello", "other"]
    finally:
        await store.close()


async def test_opening_a_postgres_that_is_not_there_is_unavailable(tmp_path: Path) -> None:
    from tests.support.ports import free_port

    with pytest.raises(StoreUnavailable):
        await open_store(f"postgresql://thaw@127.0.0.1:{free_port()}/thaw", tmp_path)


@pytest.mark.parametrize("url", ["postgresql://", "mysql://u@h/db", "postgresql://u@h:99999/db",
                                 "postgresql://u@h:5432", "sqlite3", ""])
def test_a_store_url_that_names_no_store_is_refused_saying_what_would(url: str) -> None:
    with pytest.raises(ValueError, match=r"use sqlite .* or postgresql://USER@HOST:PORT/DB"):
        PlacementConfig(state_dir=Path("/tmp/x"), cluster_keys=RING, store=url)


def test_a_refused_store_url_does_not_show_its_password() -> None:
    with pytest.raises(ValueError) as caught:
        check_store_url("mysql://thaw:s3cret@db.test/thaw")
    assert "s3cret" not in str(caught.value)
    assert check_store_url("postgresql://thaw:pw@db.test:5432/thaw")


async def test_a_postgres_pool_run_dry_makes_callers_wait_and_counts_the_wait(
    postgres_url: str, tmp_path: Path,
) -> None:
    waits: list[float] = []
    store = await open_store(postgres_url, tmp_path, pool_size=1, on_wait=waits.append)
    try:
        await store.apps.create(hello("waited"))
        holding = asyncio.Event()

        async def hold_the_only_connection() -> None:
            async with store.database.transaction() as tx:
                await tx.row("SELECT 1")
                holding.set()
                await asyncio.sleep(0.5)

        held = asyncio.create_task(hold_the_only_connection())
        await holding.wait()
        assert (await store.apps.get("waited")).name == "waited"  # waited, then answered
        await held
        assert len(waits) == 1
        assert await store.apps.get("waited") is not None  # a free connection: no wait
        assert len(waits) == 1
    finally:
        await store.close()
