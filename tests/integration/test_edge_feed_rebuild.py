"""The edge's registry feed while the registry is being filled again after a loss."""

from __future__ import annotations

import time

from edge.adapters.registry_feed import RegistryFeed
from edge.view import View
from ground.appconfig import parse
from ground.registry.memory import MemoryRegistry
from ground.registry.types import MachineRecord


def started(mid: str) -> MachineRecord:
    return MachineRecord(id=mid, app="a", worker="w1", region="local", state="started",
                         image_digest="", created_at=1.0, updated_at=time.time(),
                         address="127.0.0.1:9")


async def test_an_app_republished_before_its_machines_keeps_the_machines_the_edge_knows() -> None:
    registry = MemoryRegistry()
    config = parse({"name": "a", "image": "img:1"})
    await registry.put_app(config)
    await registry.put_machine(started("m1"))
    view = View("localhost", clock=time.monotonic)
    feed = RegistryFeed(view, registry, resync_interval_s=30)
    await feed.load()
    assert [s.id for s in view.apps["a"].routable] == ["m1"]

    # the registry was flushed and placement published the app again (a feed change),
    # the agent has not yet published its machine: the edge keeps routing to it
    await registry.delete_machine("a", "m1")  # as if lost with the registry, without news
    await feed.refresh("app", "a")
    assert [s.id for s in view.apps["a"].routable] == ["m1"]
    # a machine's own change is news: it goes
    await feed.refresh("machine", "a/m1")
    assert view.apps["a"].routable == []
