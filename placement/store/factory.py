"""Open placement's store from its `--store` setting: `sqlite` (the embedded default,
`state_dir/apps.sqlite3`) or `postgresql://USER@HOST:PORT/DB`; migrated before use."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from placement.store.apps import SqlAppStore
from placement.store.database import Database
from placement.store.migrations import migrate
from placement.store.tokens import SqlImageStore, SqlTokenStore

SQLITE_FILE = "apps.sqlite3"
POSTGRES_SCHEMES = ("postgresql", "postgres")
STORE_HELP = "sqlite (a file in the state dir) or postgresql://USER@HOST:PORT/DB"


class SqlStore:
    """The store's three parts over one database (either backend)."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.apps = SqlAppStore(database)
        self.images = SqlImageStore(database)
        self.tokens = SqlTokenStore(database)

    async def close(self) -> None:
        await self.database.close()


def check_store_url(url: str) -> str:
    """`url` if it names a store, else ValueError saying what would (no password shown)."""
    if url == "sqlite":
        return url
    parts = urlsplit(url)
    shown = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl() \
        if "@" in parts.netloc else url
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in POSTGRES_SCHEMES or not parts.hostname or port == -1 \
            or not parts.path.strip("/"):
        raise ValueError(f"store: {shown!r} is not a store; use {STORE_HELP}")
    return url


def with_password(url: str, password_file: Path | None) -> str:
    """A postgresql:// `url` with the password of `password_file` (a 0600 file) for its
    user; `url` itself without a file. ValueError for a password given twice, a file for
    the SQLite store or a URL without a user."""
    if password_file is None:
        return url
    from ground.auth.secrets_files import read_secret

    parts = urlsplit(check_store_url(url))
    if url == "sqlite":
        raise ValueError("--store-password-file is for a postgresql:// store")
    if parts.password is not None:
        raise ValueError("the store's password is given both in the URL and in "
                         "--store-password-file: give it once")
    if not parts.username:
        raise ValueError("the store URL names no user: postgresql://USER@HOST:PORT/DB")
    password = read_secret(password_file)
    if not password:
        raise ValueError(f"{password_file} is empty")
    user, _, where = parts.netloc.rpartition("@")
    secret = quote(password, safe="")
    return parts._replace(netloc=f"{quote(unquote(user), safe='')}:{secret}@{where}").geturl()


async def open_store(url: str, state_dir: Path, *, pool_size: int = 0,
                     on_wait: Callable[[float], None] | None = None) -> SqlStore:
    """The store `url` names, its schema migrated to this code's version, and hosts
    indexed (a store written before hosts were owned). PostgreSQL: `pool_size`
    connections (0: the default), `on_wait(seconds)` told of each wait for one."""
    database: Database
    if check_store_url(url) == "sqlite":
        from placement.store.sqlite import SQLiteDatabase

        database = SQLiteDatabase(state_dir / SQLITE_FILE)
    else:
        from placement.store.postgres import POOL_SIZE, PostgresDatabase

        database = postgres = PostgresDatabase(url, pool_size or POOL_SIZE, on_wait)
        await postgres.open()
    store = SqlStore(database)
    try:
        await migrate(database)
        await store.apps.index_hosts()
    except BaseException:
        await store.close()
        raise
    return store
