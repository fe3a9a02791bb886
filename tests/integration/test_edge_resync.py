"""The edge's full resync: few reads, applied in slices, and never older than the feed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

import msgspec

from edge.adapters import registry_feed
from edge.adapters.registry_feed import REBUILD_BOUND_S, RegistryFeed
from edge.view import View
from ground.appconfig import AppConfig, parse
from ground.registry.memory import MemoryRegistry
from ground.registry.types import MachineRecord
from tests.support.loopturns import LoopTurns


def config(name: str) -> AppConfig:
    return parse({"name": name, "image": "img", "hosts": [f"www.{name}.test"]})


def started(app: str, mid: str) -> MachineRecord:
    return MachineRecord(id=mid, app=app, worker="w1", region="local", state="started",
                         image_digest="", created_at=1.0, updated_at=time.time(),
                         address="127.0.0.1:9")


class Registry(MemoryRegistry):
    """A memory registry that counts per-app reads and can run something in the middle
    of a load (between its reads and its applying them)."""

    def __init__(self) -> None:
        super().__init__()
        self.per_app_reads = 0
        self.meanwhile: list[object] = []

    async def machines(self, app: str) -> list[MachineRecord]:
        self.per_app_reads += 1
        return await super().machines(app)

    async def machines_of(self, apps: Iterable[str]) -> dict[str, list[MachineRecord]]:
        found = await super().machines_of(apps)
        while self.meanwhile:
            await self.meanwhile.pop(0)  # type: ignore[misc]
        return found


async def loaded(registry: Registry) -> tuple[View, RegistryFeed]:
    view = View("localhost", clock=time.monotonic)
    feed = RegistryFeed(view, registry, resync_interval_s=30)
    await feed.load()
    return view, feed


async def test_a_full_load_reads_machines_in_one_batch_never_app_by_app() -> None:
    registry = Registry()
    for n in range(50):
        await registry.put_app(config(f"a{n}"))
        await registry.put_machine(started(f"a{n}", "m1"))
    view, _ = await loaded(registry)
    assert registry.per_app_reads == 0
    assert len(view.apps) == 50 and all(len(e.routable) == 1 for e in view.apps.values())
    assert view.route("www.a7.test") is view.apps["a7"]


async def test_a_load_of_many_apps_lets_the_loop_turn_between_slices() -> None:
    registry = Registry()
    for n in range(registry_feed.LOAD_SLICE * 5):
        await registry.put_app(config(f"a{n}"))
    view = View("localhost", clock=time.monotonic)
    feed = RegistryFeed(view, registry, resync_interval_s=30)
    async with LoopTurns() as turns:
        await feed.load()
    assert turns.count >= 4  # at least once between every two slices
    assert len(view.apps) == registry_feed.LOAD_SLICE * 5


async def test_a_machine_deleted_while_a_resync_runs_is_not_brought_back_by_it() -> None:
    registry = Registry()
    await registry.put_app(config("a"))
    await registry.put_machine(started("a", "m1"))
    view, feed = await loaded(registry)

    async def deleted_and_followed() -> None:  # the feed hears of it mid-load
        await registry.delete_machine("a", "m1")
        await feed.refresh("machine", "a/m1")

    registry.meanwhile.append(deleted_and_followed())
    await feed.load()  # it read m1 before the delete
    assert view.apps["a"].routable == []


async def test_an_app_deleted_or_made_while_a_resync_runs_is_left_as_the_feed_left_it() -> None:
    registry = Registry()
    await registry.put_app(config("old"))
    view, feed = await loaded(registry)

    async def changed_and_followed() -> None:
        await registry.delete_app("old")
        await feed.refresh("app", "old")
        await registry.put_app(config("new"))
        await feed.refresh("app", "new")

    registry.meanwhile.append(changed_and_followed())
    await feed.load()  # it read "old" and not "new"
    assert sorted(view.apps) == ["new"]
    assert view.route("www.old.test") is None and view.route("www.new.test") is not None


async def test_a_load_while_the_registry_is_filled_again_adds_but_never_removes_until_marked(
) -> None:
    registry = Registry()
    await registry.put_app(config("a"))
    await registry.put_machine(started("a", "m1"))
    view, feed = await loaded(registry)
    await registry.delete_app("a")
    generation = await registry.generation()
    feed.rebuilding = (generation, asyncio.get_running_loop().time())
    await registry.put_app(config("b"))
    await feed.load()
    assert sorted(view.apps) == ["a", "b"] and len(view.apps["a"].routable) == 1
    await registry.mark_republished(generation)  # a placement says everything is back
    await feed.load()
    assert sorted(view.apps) == ["b"] and feed.rebuilding is None


async def test_a_refill_no_placement_marks_is_taken_as_whole_after_the_bound() -> None:
    registry = Registry()
    await registry.put_app(config("a"))
    view, feed = await loaded(registry)
    await registry.delete_app("a")
    now = asyncio.get_running_loop().time()
    feed.rebuilding = (await registry.generation(), now)
    await feed.load()
    assert sorted(view.apps) == ["a"]
    feed.rebuilding = (await registry.generation(), now - REBUILD_BOUND_S - 1)
    await feed.load()
    assert view.apps == {} and feed.rebuilding is None


async def test_while_the_registry_is_filled_again_an_apps_change_waits_for_the_markers_load(
) -> None:
    registry = Registry()
    await registry.put_app(config("a"))
    view, feed = await loaded(registry)
    generation = await registry.generation()
    feed.rebuilding = (generation, asyncio.get_running_loop().time())
    await registry.put_app(parse({"name": "a", "image": "img2", "hosts": ["www.a.test"]}))
    reads = registry.per_app_reads
    await feed.refresh("app", "a")  # a refill's republish: not read app by app
    assert registry.per_app_reads == reads and view.apps["a"].config.image == "img"
    await registry.mark_republished(generation)
    await feed.load()  # the load the marker allows brings it
    assert view.apps["a"].config.image == "img2" and feed.rebuilding is None


async def test_a_resync_with_nothing_written_since_the_feeds_last_change_loads_nothing(
) -> None:
    class Counting(Registry):
        def __init__(self) -> None:
            super().__init__()
            self.loads = 0

        async def apps(self) -> list[AppConfig]:
            self.loads += 1
            return await super().apps()

    registry = Counting()
    await registry.put_app(config("a"))
    view = View("localhost", clock=time.monotonic)
    feed = RegistryFeed(view, registry, resync_interval_s=0.05)
    await feed.load()
    feed.start()
    try:
        await asyncio.sleep(0.3)  # five resyncs due, the feed at the newest change
        assert registry.loads == 1
        await registry.put_app(config("b"))  # written: the feed brings it, and the next
        await asyncio.sleep(0.2)  # resync finds the feed where the registry is again
        assert "b" in view.apps and registry.loads == 1
        feed.position = "0"  # as if a change were missed: the next resync loads
        await asyncio.sleep(0.2)
        assert registry.loads >= 2
    finally:
        await feed.stop()


async def test_a_resync_drops_a_resting_record_the_registry_no_longer_has() -> None:
    """A suspended (or starting) machine whose deletion the feed missed is not thawed, nor
    does a ghost `starting` keep the edge from thawing, after the next full load."""
    registry = Registry()
    await registry.put_app(config("nap"))
    for mid, state in (("m1", "suspended"), ("m2", "starting")):
        await registry.put_machine(msgspec.structs.replace(started("nap", mid), state=state,
                                                           address=""))
    view, feed = await loaded(registry)
    assert set(view.apps["nap"].resting) == {"m1", "m2"}
    await registry.delete_machine("nap", "m1")  # not followed: the feed is not running
    await registry.delete_machine("nap", "m2")
    await feed.load()
    assert view.apps["nap"].resting == {}
