"""Placement's wake path — the real Waker, Placer, Fleet and fleet index — over workers in
memory (tests/support/memory_workers.py) and a registry in memory: no process, no socket,
so the wake's rules can be tried case by case (what test_placement_*.py and the e2e
tests show against real agents)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from ground.appconfig import AppConfig, Concurrency, GuestConfig
from placement.api import WakeRequest
from placement.errors import PlacementError
from placement.wakes.waker import Waker
from tests.support.memory_placement import MemoryPlacement, memory_placement
from tests.support.memory_workers import MemoryWorker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    placement = await memory_placement(cpus=1.0, memory_mb=512)

    async def current(config: AppConfig) -> bool:
        return True

    waker = Waker(placement.fleet, placement.placer, 0, current)
    try:
        yield Setup(placement, waker)
    finally:
        await waker.close()
        await placement.close()


@dataclass
class Setup:
    placement: MemoryPlacement
    waker: Waker


def app(**fields: object) -> AppConfig:
    settings: dict[str, object] = {"guest": GuestConfig(cpus=0.5, memory_mb=256), **fields}
    return AppConfig(name="web", image="example/web:v1", regions=["local"],
                     **settings)  # type: ignore[arg-type]


def running(setup: Setup) -> dict[str, list[str]]:
    """Machines started on each worker (ids), from the workers' own state."""
    return setup.placement.started_on()


async def test_a_cold_wake_starts_one_machine_and_answers_its_address(setup: Setup) -> None:
    config = app()
    answer = await setup.waker.wake(config, WakeRequest(count=1, deadline_ms=5000))
    [woken] = answer.machines
    assert woken.address.startswith(f"{woken.worker}.machines:")
    assert running(setup)[woken.worker] == [woken.id]
    # a wake for a demand that machine covers finds it up (its record is in the
    # registry): nothing new is made, its address is the answer
    again = await setup.waker.wake(config, WakeRequest(count=1, deadline_ms=5000,
                                                       demand=1, edge="e1"))
    assert [m.id for m in again.machines] == [woken.id]
    assert sum(len(ids) for ids in running(setup).values()) == 1


async def test_a_burst_is_sized_by_demand_and_spread_over_the_workers(setup: Setup) -> None:
    config = app(concurrency=Concurrency(soft_limit=10, hard_limit=20), max_machines=8)
    answer = await setup.waker.wake(config, WakeRequest(count=1, deadline_ms=5000,
                                                        demand=40, edge="e1"))
    # 40 requests at soft_limit 10 want 4 machines (max_machines 8); 1 cpu and 512 MB a
    # worker fit 2 of 0.5 cpu / 256 MB each: 4 in all, two on each worker
    assert len(answer.machines) == 4
    assert {w: len(ids) for w, ids in running(setup).items()} == {"w1": 2, "w2": 2}


async def test_a_stopped_machine_is_started_again_rather_than_a_new_one_made(
    setup: Setup,
) -> None:
    config = app()
    [first] = (await setup.waker.wake(config, WakeRequest(deadline_ms=5000))).machines
    stopped = await setup.placement.workers.stop(setup.placement.urls[first.worker], first.id)
    assert getattr(stopped, "state", "") == "stopped"
    [again] = (await setup.waker.wake(config, WakeRequest(deadline_ms=5000))).machines
    assert again.id == first.id
    assert sum(len(w.state.machines) for w in setup.placement.workers.workers.values()) == 1


async def test_with_one_worker_down_the_machine_goes_to_the_other(setup: Setup) -> None:
    w1 = setup.placement.workers.workers[setup.placement.urls["w1"]]
    w1.down = True  # its agent answers nothing
    config = app()
    [woken] = (await setup.waker.wake(config, WakeRequest(deadline_ms=5000))).machines
    assert woken.worker == "w2"


async def test_no_room_anywhere_is_no_capacity_and_nothing_is_left_half_made(
    setup: Setup,
) -> None:
    big = app(guest=GuestConfig(cpus=2.0, memory_mb=256))  # more than any worker has
    with pytest.raises(PlacementError) as failed:
        await setup.waker.wake(big, WakeRequest(deadline_ms=2000))
    assert failed.value.code == "no_capacity", failed.value.message
    assert all(not w.state.machines for w in setup.placement.workers.workers.values())


async def test_an_offer_declined_goes_to_the_next_worker_which_accepts(setup: Setup) -> None:
    """The worker offered first declines (it began draining after its last heartbeat):
    the machine is offered to the next one, which starts it."""
    workers = setup.placement.workers
    workers.on_first["POST /v1/offers"] = lambda worker: setattr(worker, "draining", True)
    [woken] = (await setup.waker.wake(app(), WakeRequest(deadline_ms=5000))).machines
    offers = [url for call, url in workers.calls if call == "POST /v1/offers"]
    assert len(offers) == 2 and offers[1] == setup.placement.urls[woken.worker] != offers[0]
    assert running(setup)[woken.worker] == [woken.id]
    assert not workers.workers[offers[0]].state.machines  # declined: nothing made there


@pytest.mark.parametrize("dies_at", ["POST /v1/images/pull", "POST /v1/machines/{id}/start"])
async def test_a_worker_dying_mid_wake_has_the_machine_started_on_another(
    setup: Setup, dies_at: str,
) -> None:
    """Its machine was accepted there, then the worker stops answering (its host died):
    another machine is placed on the other worker within the same wake (it used to fail
    the wake as `deadline` at once); the one left on the dead worker is the reconciler's
    once it is back."""
    workers = setup.placement.workers
    workers.on_first[dies_at] = lambda worker: setattr(worker, "down", True)
    [woken] = (await setup.waker.wake(app(), WakeRequest(deadline_ms=5000))).machines
    offers = [url for call, url in workers.calls if call == "POST /v1/offers"]
    assert len(offers) == 2 and offers[1] == setup.placement.urls[woken.worker] != offers[0]
    assert running(setup)[woken.worker] == [woken.id]
    assert [m.state.value for m in workers.workers[offers[0]].state.machines.values()] == [
        "created"]


async def test_both_workers_dying_mid_wake_fail_it_as_start_failed_naming_both(
    setup: Setup,
) -> None:
    workers = setup.placement.workers
    start = "POST /v1/machines/{id}/start"

    def dies(worker: MemoryWorker) -> None:  # every worker its start reaches
        worker.down = True
        workers.on_first[start] = dies

    workers.on_first[start] = dies
    with pytest.raises(PlacementError) as failed:
        await setup.waker.wake(app(), WakeRequest(deadline_ms=5000))
    assert failed.value.code == "start_failed", failed.value.message
    assert failed.value.message.count("did not answer the start") == 2
