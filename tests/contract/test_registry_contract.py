"""One contract for every registry backend (memory now; Redis joins this list)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from ground.appconfig import parse
from ground.registry import MachineRecord, PlacementAdvert, Registry, WorkerStatus
from ground.registry.memory import MemoryRegistry
from ground.registry.redis import RedisRegistry
from ground.registry.types import WORKERS


class Backend:
    """A registry under test and a way to let time pass for its TTLs."""

    def __init__(self, registry: Registry, advance: Callable[[float], Awaitable[None]]):
        self.registry = registry
        self.advance = advance


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "memory":
        clock = FakeClock()

        async def tick(seconds: float) -> None:
            clock.now += seconds

        memory = MemoryRegistry(clock=clock)
        yield Backend(memory, tick)
        await memory.close()
        return
    url = await request.getfixturevalue("redis_server").flushed()
    registry = RedisRegistry(url)
    yield Backend(registry, asyncio.sleep)
    await registry.close()


def worker(wid: str, epoch: int = 1, region: str = "local", **kw: object) -> WorkerStatus:
    return WorkerStatus(id=wid, epoch=epoch, region=region, url=f"http://{wid}",
                        cpus=4, memory_mb=4096, **kw)  # type: ignore[arg-type]


def machine(mid: str, app: str = "hello", updated_at: float = 1.0, state: str = "started"):
    return MachineRecord(id=mid, app=app, worker="w1", region="local", state=state,
                         image_digest="sha256:aa", created_at=0.0, updated_at=updated_at)


async def test_a_published_worker_is_listed_by_its_region(backend) -> None:
    registry = backend.registry
    await registry.publish_worker(worker("w1"), ttl_s=3)
    await registry.publish_worker(worker("w2", region="fra"), ttl_s=3)
    assert [w.id for w in await registry.workers("local")] == ["w1"]
    assert {w.id for w in await registry.workers()} == {"w1", "w2"}


async def test_one_worker_is_read_by_its_id_while_its_heartbeat_lives(backend) -> None:
    registry = backend.registry
    await registry.publish_worker(worker("w1"), ttl_s=1.0)
    found = await registry.worker("w1")
    assert found is not None and found.id == "w1" and found.url == worker("w1").url
    assert await registry.worker("w2") is None
    await backend.advance(1.2)
    assert await registry.worker("w1") is None


async def test_more_calls_at_once_than_connections_all_get_answers(backend) -> None:
    registry = backend.registry
    await registry.publish_worker(worker("w1"), ttl_s=30)
    found = await asyncio.gather(*(registry.workers() for _ in range(300)))
    assert all([w.id for w in workers] == ["w1"] for workers in found)


async def test_a_worker_vanishes_when_its_heartbeat_ttl_lapses(backend) -> None:
    registry = backend.registry
    await registry.publish_worker(worker("w1"), ttl_s=1.0)
    await backend.advance(0.5)
    assert len(await registry.workers()) == 1
    await backend.advance(0.7)
    assert await registry.workers() == []


async def test_fencing_outlives_the_ttl_so_a_stale_agent_cannot_come_back(backend) -> None:
    registry = backend.registry
    await registry.publish_worker(worker("w1", epoch=5), ttl_s=0.2)
    await backend.advance(0.3)
    await registry.publish_worker(worker("w1", epoch=4), ttl_s=3)
    assert await registry.workers() == []
    await registry.publish_worker(worker("w1", epoch=6), ttl_s=3)
    assert [w.epoch for w in await registry.workers()] == [6]


async def test_a_lower_epoch_cannot_overwrite_a_newer_registration(backend) -> None:
    registry = backend.registry
    await registry.publish_worker(worker("w1", epoch=5), ttl_s=3)
    await registry.publish_worker(worker("w1", epoch=4, draining=True), ttl_s=3)
    [current] = await registry.workers()
    assert current.epoch == 5 and not current.draining


async def test_layer_sets_feed_the_inverted_index(backend) -> None:
    registry = backend.registry
    await registry.set_worker_layers("w1", {"sha256:a": 10, "sha256:b": 20})
    await registry.set_worker_layers("w2", {"sha256:a": 10})
    assert await registry.layer_holders("sha256:a") == {"w1": 10, "w2": 10}
    await registry.set_worker_layers("w1", {"sha256:b": 20})
    assert await registry.layer_holders("sha256:a") == {"w2": 10}
    assert await registry.layer_holders("sha256:zz") == {}


async def test_machine_puts_are_idempotent_and_never_go_back_in_time(backend) -> None:
    registry = backend.registry
    await registry.put_machine(machine("m1", updated_at=2.0, state="started"))
    await registry.put_machine(machine("m1", updated_at=2.0, state="started"))
    await registry.put_machine(machine("m1", updated_at=1.0, state="starting"))
    [record] = await registry.machines("hello")
    assert record.state == "started"
    await registry.delete_machine("hello", "m1")
    assert await registry.machines("hello") == []


async def test_the_change_feed_reports_every_write_in_order(backend) -> None:
    registry = backend.registry
    feed = registry.changes(after=await registry.feed_position())
    first = asyncio.ensure_future(feed.__anext__())
    await registry.put_machine(machine("m1"))
    change = await asyncio.wait_for(first, 1)
    assert (change.kind, change.key) == ("machine", "hello/m1")
    await registry.put_app(parse({"name": "hello", "image": "img:1"}))
    change2 = await asyncio.wait_for(feed.__anext__(), 1)
    assert (change2.kind, change2.key) == ("app", "hello")
    replay = registry.changes(after=change.seq)
    again = await asyncio.wait_for(replay.__anext__(), 1)
    assert again.seq == change2.seq
    await feed.aclose()
    await replay.aclose()


async def test_heartbeats_and_layer_sets_go_to_the_workers_feed_never_the_routes_feed(
    backend,
) -> None:
    registry = backend.registry
    routes = registry.changes(after=await registry.feed_position())
    workers = registry.changes(after=await registry.feed_position(WORKERS), feed=WORKERS)
    await registry.publish_worker(worker("w1"), ttl_s=3)
    await registry.set_worker_layers("w1", {"sha256:a": 10})
    await registry.put_machine(machine("m1"))
    beat = await asyncio.wait_for(workers.__anext__(), 1)
    layers = await asyncio.wait_for(workers.__anext__(), 1)
    assert [(c.kind, c.key) for c in (beat, layers)] == [("worker", "w1"), ("layers", "w1")]
    # the routes feed's next change is the machine's: an edge reads no heartbeat
    change = await asyncio.wait_for(routes.__anext__(), 1)
    assert (change.kind, change.key) == ("machine", "hello/m1")
    assert await registry.feed_position(WORKERS) == layers.seq
    assert await registry.feed_position() == change.seq
    await routes.aclose()
    await workers.aclose()


async def test_app_configs_are_stored_whole_and_never_go_back_a_version(backend) -> None:
    from ground.appconfig import parse

    registry = backend.registry
    v2 = parse({"name": "hello", "image": "img:2", "version": 2})
    v1 = parse({"name": "hello", "image": "img:1", "version": 1})
    await registry.put_app(v2)
    await registry.put_app(v1)
    assert await registry.app("hello") == v2
    assert [a.name for a in await registry.apps()] == ["hello"]
    await registry.delete_app("hello")
    assert await registry.app("hello") is None and await registry.apps() == []


async def test_the_generation_names_the_view_and_stays_while_the_view_lives(backend) -> None:
    registry = backend.registry
    first = await registry.generation()
    assert first and len(first) <= 64
    await registry.put_machine(machine("m1"))
    await registry.publish_worker(worker("w1"), ttl_s=3)
    assert await registry.generation() == first  # writes keep it; only a loss changes it


async def test_a_heartbeat_answers_the_generation_even_when_its_epoch_is_refused(backend) -> None:
    """What a worker notices a lost view by, without asking (a new view gets its name
    from whichever comes first, the heartbeat or `generation()`)."""
    registry = backend.registry
    heard = await registry.publish_worker(worker("w1", epoch=5), ttl_s=3)
    assert heard == await registry.generation()
    assert await registry.publish_worker(worker("w1", epoch=4), ttl_s=3) == heard


async def test_machines_of_many_apps_is_machines_of_each_and_leaves_out_apps_with_none(
    backend,
) -> None:
    registry = backend.registry
    names = [f"app{n}" for n in range(450)]  # more than one round trip's worth
    for n, name in enumerate(names):
        for k in range(n % 3):
            await registry.put_machine(machine(f"m{n}-{k}", app=name))
    found = await registry.machines_of([*names, "nobody"])
    assert set(found) == {name for n, name in enumerate(names) if n % 3}
    for name in ["app1", "app2", "app449"]:
        assert sorted(r.id for r in found[name]) == sorted(
            r.id for r in await registry.machines(name))
    assert await registry.machines_of([]) == {}


async def test_reads_of_many_see_every_change_since_the_last_read(backend) -> None:
    from ground.appconfig import parse

    registry = backend.registry
    await registry.put_app(parse({"name": "hello", "image": "img:1", "version": 1}))
    await registry.put_machine(machine("m1", updated_at=1.0, state="starting"))
    assert [a.image for a in await registry.apps()] == ["img:1"]
    assert [r.state for r in (await registry.machines_of(["hello"]))["hello"]] == ["starting"]
    await registry.put_app(parse({"name": "hello", "image": "img:2", "version": 2}))
    await registry.put_machine(machine("m1", updated_at=2.0, state="started"))
    assert [a.image for a in await registry.apps()] == ["img:2"]
    assert [r.state for r in (await registry.machines_of(["hello"]))["hello"]] == ["started"]
    await registry.delete_machine("hello", "m1")
    assert await registry.machines_of(["hello"]) == {}


async def test_a_placement_advert_is_listed_until_its_ttl_lapses(backend: Backend) -> None:
    registry = backend.registry
    assert await registry.placements() == []
    await registry.publish_placement(PlacementAdvert("p2", "http://b:1", "s2"), ttl_s=1.0)
    await registry.publish_placement(PlacementAdvert("p1", "http://a:1", "s1"), ttl_s=30)
    await registry.publish_placement(PlacementAdvert("p1", "http://a:2", "s1b"), ttl_s=30)
    assert await registry.placements() == [PlacementAdvert("p1", "http://a:2", "s1b"),
                                           PlacementAdvert("p2", "http://b:1", "s2")]
    await backend.advance(1.2)
    assert [p.id for p in await registry.placements()] == ["p1"]


async def test_put_apps_is_put_app_of_each_guarded_by_version_with_a_change_each(
    backend,
) -> None:
    from ground.appconfig import parse

    registry = backend.registry
    await registry.put_app(parse({"name": "app0", "image": "img:9", "version": 9}))
    position = await registry.feed_position()
    configs = [parse({"name": f"app{n}", "image": "img:1", "version": 1}) for n in range(450)]
    await registry.put_apps(configs)  # more than one round trip's worth
    found = {c.name: c for c in await registry.apps()}
    assert set(found) == {c.name for c in configs}
    assert found["app0"].version == 9  # the newer stored one is kept
    assert found["app449"] == configs[449]
    changes = registry.changes(after=position)
    seen = [await anext(changes) for _ in range(449)]
    await changes.aclose()
    assert {(c.kind, c.key) for c in seen} == {("app", f"app{n}") for n in range(1, 450)}
    await registry.put_apps([])


async def test_the_republished_marker_names_only_the_current_generation(backend) -> None:
    registry = backend.registry
    assert await registry.republished() == ""
    await registry.mark_republished("not-the-current-one")
    assert await registry.republished() == ""
    generation = await registry.generation()
    position = await registry.feed_position()
    await registry.mark_republished(generation)
    assert await registry.republished() == generation
    changes = registry.changes(after=position)
    change = await anext(changes)
    await changes.aclose()
    assert (change.kind, change.key) == ("republished", generation)


async def test_a_registry_on_its_own_connections_is_the_same_view(backend) -> None:
    from ground.appconfig import parse

    registry = backend.registry
    own = registry.with_own_connections()
    try:
        await own.put_apps([parse({"name": "hello", "image": "img:1"})])
        assert [a.name for a in await registry.apps()] == ["hello"]
        assert await own.generation() == await registry.generation()
    finally:
        if own is not registry:
            await own.close()
