"""Placement's reconciler — the real Reconciler, its actions, Placer, Fleet and fleet index,
on a real SQLite store — over workers in memory (tests/support/memory_workers.py) and a
registry in memory: no process, no socket, so its rules are tried case by case (the
integration and e2e tests show them against real agents)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from ground.appconfig import AppConfig, GuestConfig
from placement.applocks import AppLocks
from placement.fleet.republish import Republisher
from placement.reconciling.reconciler import Reconciler
from placement.store.apps import SqlAppStore
from placement.store.factory import open_store
from placement.wakes.waker import Waker
from tests.support.memory_placement import MemoryPlacement, memory_placement

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@dataclass
class Setup:
    placement: MemoryPlacement
    store: SqlAppStore
    reconciler: Reconciler


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    placement = await memory_placement(cpus=1.0, memory_mb=1024)
    opened = await open_store("sqlite", tmp_path)
    store = opened.apps
    waker = Waker(placement.fleet, placement.placer, 0, store.is_current)
    locks = AppLocks()
    republisher = Republisher(placement.registry, store, locks, 30.0,
                              live_workers=placement.fleet.live_workers)
    reconciler = Reconciler(store, placement.fleet, placement.placer, waker, locks,
                            placement.registry, republisher, drain_s=0.0)
    try:
        yield Setup(placement, store, reconciler)
    finally:
        await reconciler.close()
        await waker.close()
        await placement.close()
        await opened.close()


async def stored(setup: Setup, **fields: object) -> AppConfig:
    settings: dict[str, object] = {"guest": GuestConfig(cpus=0.5, memory_mb=256), **fields}
    config = AppConfig(name="web", image="example/web:v1", regions=["local"],
                       **settings)  # type: ignore[arg-type]
    made = await setup.store.create(config)
    await setup.placement.registry.put_app(made)
    return made


async def settled(setup: Setup) -> None:
    assert await setup.reconciler.pass_now("web")
    await setup.reconciler.settle("web", 10)


async def test_min_running_two_puts_one_machine_on_each_worker(setup: Setup) -> None:
    await stored(setup, min_machines_running=2)
    await settled(setup)
    assert {w: len(ids) for w, ids in setup.placement.started_on().items()} == {"w1": 1,
                                                                              "w2": 1}
    await settled(setup)  # its shape: a second pass changes nothing
    assert {w: len(ids) for w, ids in setup.placement.started_on().items()} == {"w1": 1,
                                                                              "w2": 1}


async def test_a_spare_is_made_and_not_started(setup: Setup) -> None:
    await stored(setup, min_machines_running=1, spares=1)
    await settled(setup)
    states = setup.placement.states()
    assert states == ["created", "started"]


async def changed(setup: Setup, config: AppConfig, **fields: object) -> AppConfig:
    made = await setup.store.update(msgspec.structs.replace(config, **fields))
    await setup.placement.registry.put_app(made)
    return made


async def test_spares_lowered_to_zero_destroys_the_standby_made_for_them(setup: Setup) -> None:
    config = await stored(setup, min_machines_running=1, spares=1)
    await settled(setup)
    await changed(setup, config, spares=0)
    await settled(setup)
    assert setup.placement.states() == ["started"]


async def test_max_machines_lowered_destroys_the_idle_surplus_not_the_running(
    setup: Setup,
) -> None:
    config = await stored(setup, min_machines_running=1, spares=2, max_machines=3)
    await settled(setup)
    assert setup.placement.states() == [
        "created", "created", "started"]
    await changed(setup, config, spares=0, max_machines=1)
    await settled(setup)
    assert setup.placement.states() == ["started"]


async def test_a_new_release_replaces_each_machine_once_and_completes(setup: Setup) -> None:
    config = await stored(setup, min_machines_running=2, release=1)
    await settled(setup)
    workers = setup.placement.workers.workers.values()
    before = {m.id for w in workers for m in w.state.machines.values()}
    await changed(setup, config, image="example/web:v2", release=2)
    for _ in range(4):  # a rolling deploy: one at a time (max_unavailable 1)
        await settled(setup)
    after = [m for w in workers for m in w.state.machines.values()]
    assert sorted(m.state.value for m in after) == ["started", "started"]
    assert {m.spec.release for m in after} == {2} and not before & {m.id for m in after}
    made = sum(1 for call, _ in setup.placement.workers.calls if call == "POST /v1/offers")
    assert made == 4  # two at first, one replacement each: none twice


async def test_a_second_pass_over_a_settled_app_asks_no_worker_to_change_anything(
    setup: Setup,
) -> None:
    await stored(setup, min_machines_running=2, spares=1)
    await settled(setup)
    calls = setup.placement.workers.calls
    seen = len(calls)
    await settled(setup)
    changes = [call for call, _ in calls[seen:] if not call.startswith("GET ")]
    assert changes == [], changes
    assert setup.placement.states() == ["created", "started", "started"]
