"""One contract for both store backends (SQLite embedded, PostgreSQL shared): every test
runs against each, on a fresh store; a second store on the same data plays a second
placement."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest

from ground.appconfig import AppConfig
from ground.auth.tokens import TokenRecord
from placement.api import AppEvent, Release
from placement.errors import Conflict, NotFound
from placement.store import (
    EVENTS_KEPT,
    HostTaken,
    SecretWrites,
    SqlStore,
    StoredSecret,
    open_store,
)
from placement.store.migrations import migrate, schema_version
from tests.support.postgres import postgres_server, postgres_url

__all__ = ["postgres_server", "postgres_url"]  # fixtures


class Backend:
    """A fresh store, and a way to open another on the same data (another placement)."""

    def __init__(self, store: SqlStore, another: Callable[[], Awaitable[SqlStore]]) -> None:
        self.store = store
        self.another = another


@pytest.fixture(params=["sqlite", "postgresql"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    url = "sqlite" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    opened: list[SqlStore] = []

    async def another() -> SqlStore:
        opened.append(await open_store(url, tmp_path))
        return opened[-1]

    yield Backend(await another(), another)
    for store in opened:
        await store.close()


def app(name: str = "hello", uid: str = "00000000000000a1", **fields: object) -> AppConfig:
    return AppConfig(name=name, image="registry.test/hello:1", uid=uid,
                     **fields)  # type: ignore[arg-type]


def release(config: AppConfig, version: int = 1) -> Release:
    return Release(app=config.name, version=version, image=config.image, image_digest="",
                   config=config, strategy="rolling", status="pending", created_at=1.0)


def token(tid: str, apps: list[str] | None = None) -> TokenRecord:
    return TokenRecord(id=tid, hash="h" + tid, admin=apps is None, apps=apps or [],
                       name=tid, created_at=1.0)


async def test_an_app_is_created_at_version_1_listed_got_and_deleted(backend: Backend) -> None:
    apps = backend.store.apps
    stored = await apps.create(app("hello"), release(app("hello")))
    await apps.create(app("alpha", uid="00000000000000b2"))
    assert stored.version == 1
    assert await apps.get("hello") == stored
    assert [c.name for c in await apps.list()] == ["alpha", "hello"]
    assert await apps.holds("hello") and await apps.is_current(stored)
    await apps.delete("hello")
    assert not await apps.holds("hello") and not await apps.is_current(stored)
    with pytest.raises(NotFound):
        await apps.get("hello")
    with pytest.raises(NotFound):
        await apps.delete("hello")


async def test_creating_an_app_twice_is_a_conflict(backend: Backend) -> None:
    await backend.store.apps.create(app("hello"))
    with pytest.raises(Conflict) as caught:
        await backend.store.apps.create(app("hello", uid="00000000000000c3"))
    assert caught.value.code == "exists"


async def test_a_host_is_held_by_one_app_and_freed_by_update_and_delete(backend: Backend) -> None:
    apps = backend.store.apps
    one = await apps.create(app("one", hosts=["www.one.test"]))
    with pytest.raises(HostTaken) as caught:
        await apps.create(app("two", uid="00000000000000b2", hosts=["www.one.test"]))
    assert (caught.value.host, caught.value.holder, caught.value.status) == (
        "www.one.test", "one", 409)
    assert await apps.holder("www.one.test") == "one"
    one = await apps.update(msgspec.structs.replace(one, hosts=["api.one.test"]))
    assert await apps.holder("www.one.test") is None
    assert await apps.holder("api.one.test") == "one"
    await apps.create(app("two", uid="00000000000000b2", hosts=["www.one.test"]))
    await apps.delete("one")
    assert await apps.holder("api.one.test") is None


async def test_a_failed_create_stores_neither_the_app_nor_its_release(backend: Backend) -> None:
    apps = backend.store.apps
    await apps.create(app("one", hosts=["www.one.test"]))
    two = app("two", uid="00000000000000b2", hosts=["api.two.test", "www.one.test"])
    with pytest.raises(HostTaken):
        await apps.create(two, release(two))
    assert not await apps.holds("two")
    assert await apps.last_release(two.uid) == 0 and await apps.releases(two.uid) == []
    assert await apps.holder("api.two.test") is None  # claimed before the failure, undone


async def test_an_update_bumps_the_version_and_refuses_a_stale_one(backend: Backend) -> None:
    apps = backend.store.apps
    v1 = await apps.create(app("hello"))
    v2 = await apps.update(msgspec.structs.replace(v1, max_machines=5))
    assert (v2.version, (await apps.get("hello")).max_machines) == (2, 5)
    with pytest.raises(Conflict):
        await apps.update(msgspec.structs.replace(v1, max_machines=7))  # made from v1
    with pytest.raises(Conflict):  # another incarnation of the name
        await apps.update(msgspec.structs.replace(v2, uid="00000000000000ff"))
    with pytest.raises(NotFound):
        await apps.update(app("nobody"))
    assert (await apps.get("hello")).version == 2


async def test_of_two_placements_updating_one_version_at_once_exactly_one_wins(
    backend: Backend,
) -> None:
    first, second = backend.store.apps, (await backend.another()).apps
    current = await first.create(app("hello"))
    for round_ in range(10):
        results = await asyncio.gather(
            first.update(msgspec.structs.replace(current, max_machines=2 + round_)),
            second.update(msgspec.structs.replace(current, max_machines=20 + round_)),
            return_exceptions=True)
        won = [r for r in results if isinstance(r, AppConfig)]
        assert len(won) == 1 and sum(isinstance(r, Conflict) for r in results) == 1, results
        current = await second.get("hello")
        assert current == won[0] and current.version == round_ + 2


async def test_releases_are_added_with_changes_and_their_status_set_with_a_config(
    backend: Backend,
) -> None:
    apps = backend.store.apps
    v1 = await apps.create(app("hello", release=1), release(app("hello")))
    v2 = await apps.update(msgspec.structs.replace(v1, release=2, image="registry.test/h:2"),
                           release(v1, 2))
    assert await apps.last_release(v1.uid) == 2
    assert [r.version for r in await apps.releases(v1.uid)] == [2, 1]
    assert (await apps.release(v1.uid, 2)).config == v2  # type: ignore[union-attr]
    assert await apps.release(v1.uid, 9) is None
    with pytest.raises(Conflict):  # a release's version is never made twice
        await apps.update(v2, release(v2, 2))
    assert await apps.set_release_status(v1.uid, 1, "complete", "done") is None
    back = msgspec.structs.replace(v2, release=1, image=v1.image)
    stored = await apps.set_release_status(v1.uid, 2, "failed", "crashed", config=back)
    assert stored is not None and stored.version == 3 and stored.image == v1.image
    statuses = [(r.status, r.reason) for r in await apps.releases(v1.uid)]
    assert statuses == [("failed", "crashed"), ("complete", "done")]
    with pytest.raises(NotFound):
        await apps.set_release_status(v1.uid, 9, "complete")


async def test_an_ended_release_is_not_moved_and_nothing_is_written_with_it(
    backend: Backend,
) -> None:
    """The table of placement/core/releases.py, kept by the store: a release rolled back
    is not marked complete by a pass that raced the rollback, nor a failed one rolled
    back; the config given with the refused move is not written either."""
    apps = backend.store.apps
    v1 = await apps.create(app("hello", release=1), release(app("hello")))
    assert await apps.set_release_status(v1.uid, 1, "rolled_back", "rolled back to 0") is None
    assert await apps.set_release_status(v1.uid, 1, "complete", "late pass") is None
    changed = msgspec.structs.replace(v1, max_machines=4)
    assert await apps.set_release_status(v1.uid, 1, "failed", "late", config=changed) is None
    assert (await apps.get("hello")).max_machines == v1.max_machines
    record = await apps.release(v1.uid, 1)
    assert record is not None and (record.status, record.reason) == (
        "rolled_back", "rolled back to 0")
    v2 = await apps.update(msgspec.structs.replace(v1, release=2), release(v1, 2))
    await apps.set_release_status(v2.uid, 2, "failed", "crashed")
    await apps.set_release_status(v2.uid, 2, "rolled_back", "rolled back to 1")
    record = await apps.release(v2.uid, 2)
    assert record is not None and (record.status, record.reason) == ("failed", "crashed")


async def test_a_release_status_is_not_set_when_its_config_is_stale(backend: Backend) -> None:
    apps = backend.store.apps
    v1 = await apps.create(app("hello", release=1), release(app("hello")))
    await apps.update(msgspec.structs.replace(v1, max_machines=4))
    with pytest.raises(Conflict):
        await apps.set_release_status(v1.uid, 1, "failed", config=v1)
    assert (await apps.release(v1.uid, 1)).status == "pending"  # type: ignore[union-attr]


async def test_events_come_newest_first_and_each_app_keeps_its_newest_ones(
    backend: Backend,
) -> None:
    apps = backend.store.apps
    for i in range(EVENTS_KEPT + 5):
        await apps.add_event("uid-a", AppEvent(float(i), "start", f"a{i}"))
        if i % 100 == 0:
            await apps.add_event("uid-b", AppEvent(float(i), "start", f"b{i}"))
    kept = await apps.events("uid-a")
    assert len(kept) == EVENTS_KEPT
    assert kept[0].reason == f"a{EVENTS_KEPT + 4}" and kept[-1].reason == "a5"
    assert [e.reason for e in await apps.events("uid-b")] == ["b500", "b400", "b300", "b200",
                                                             "b100", "b0"]
    assert len(await apps.events("uid-a", limit=3)) == 3


async def test_fenced_machines_are_kept_per_app_until_unfenced_or_deleted(
    backend: Backend,
) -> None:
    apps = backend.store.apps
    config = await apps.create(app("hello"))
    await apps.fence(config.uid, "m1", 10.0)
    await apps.fence(config.uid, "m1", 11.0)  # again: no change, no error
    await apps.fence(config.uid, "m2", 12.0)
    await apps.fence("00000000000000ff", "m3", 12.0)
    assert await apps.fenced(config.uid) == {"m1", "m2"}
    await apps.unfence("m1")
    assert await apps.fenced(config.uid) == {"m2"}
    await apps.add_event(config.uid, AppEvent(1.0, "fence", "lost"))
    await apps.delete("hello")
    assert await apps.fenced(config.uid) == frozenset()
    assert await apps.events(config.uid) == []
    assert await apps.fenced("00000000000000ff") == {"m3"}


async def test_pinned_images_keep_their_latest_layer_list(backend: Backend) -> None:
    images = backend.store.images
    assert await images.layers("sha256:aa") is None
    await images.keep("sha256:aa", {"sha256:l1": 10})
    await images.keep("sha256:aa", {"sha256:l1": 10, "sha256:l2": 20})
    assert await images.layers("sha256:aa") == {"sha256:l1": 10, "sha256:l2": 20}


async def test_tokens_are_added_listed_and_revoked_also_by_app_scope(backend: Backend) -> None:
    tokens = backend.store.tokens
    for record in (token("t2", ["hello"]), token("t1"), token("t3", ["hello", "other"]),
                   token("t4", ["other"])):
        await tokens.add(record)
    with pytest.raises(Conflict):
        await tokens.add(token("t1"))
    assert [t.id for t in await tokens.list()] == ["t1", "t2", "t3", "t4"]
    assert await tokens.get("t9") is None
    revoked = await tokens.revoke("t1", 5.0)
    assert revoked.revoked_at == 5.0 and (await tokens.get("t1")) == revoked
    assert (await tokens.revoke("t1", 6.0)).revoked_at == 5.0  # the first revocation stays
    with pytest.raises(NotFound):
        await tokens.revoke("t9", 5.0)
    assert await tokens.revoke_scoped_to("hello", 7.0) == ["t2", "t3"]
    assert await tokens.revoke_scoped_to("hello", 8.0) == []
    assert [t.revoked_at for t in await tokens.list()] == [5.0, 7.0, 7.0, None]


async def test_migrating_again_changes_nothing(backend: Backend) -> None:
    await backend.store.apps.create(app("hello"))
    assert await schema_version(backend.store.database) == 2
    assert await migrate(backend.store.database) == []
    again = await backend.another()
    assert await again.apps.get("hello") == await backend.store.apps.get("hello")
    assert await schema_version(again.database) == 2


def secret(name: str, ciphertext: bytes = b"\x00ct", key_id: str = "k1") -> StoredSecret:
    return StoredSecret(name=name, ciphertext=ciphertext, nonce=b"n" * 12, key_id=key_id,
                        digest="0123456789ab", created_at=2.0)


async def test_secrets_are_written_with_their_config_in_one_transaction_or_not_at_all(
        backend: Backend) -> None:
    apps = backend.store.apps
    stored = await apps.create(app("hello"))
    now = await apps.update(msgspec.structs.replace(stored, secrets={"B": "0123456789ab"}),
                            release(stored, 2), SecretWrites(put=(secret("B"), secret("A"))))
    assert [s.name for s in await apps.secrets(stored.uid)] == ["A", "B"]
    assert await (await backend.another()).apps.secrets(stored.uid) == [secret("A"),
                                                                        secret("B")]
    with pytest.raises(Conflict):  # written over a stale version: nothing of it is kept
        await apps.update(stored, None, SecretWrites(put=(secret("C"),), drop=("A",)))
    assert [s.name for s in await apps.secrets(stored.uid)] == ["A", "B"]
    await apps.update(now, None, SecretWrites(put=(secret("B", b"new"),), drop=("A",)))
    assert await apps.secrets(stored.uid) == [secret("B", b"new")]
    assert await apps.secrets("00000000000000b2") == []


async def test_a_secret_is_rewrapped_only_if_unchanged_and_goes_with_its_app(
        backend: Backend) -> None:
    apps = backend.store.apps
    stored = await apps.create(app("hello"))
    await apps.update(stored, None, SecretWrites(put=(secret("A"),)))
    was = (await apps.secrets(stored.uid))[0]
    rewrapped = secret("A", b"under k2", key_id="k2")
    assert await apps.rewrap_secret(stored.uid, was, rewrapped)
    assert not await apps.rewrap_secret(stored.uid, was, secret("A", b"late"))
    assert await apps.secrets(stored.uid) == [rewrapped]
    await apps.delete("hello")
    assert await apps.secrets(stored.uid) == []
