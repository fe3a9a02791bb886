"""When the reconciler passes over an app (placement/reconciling/passes.py), on a memory
registry and memory leases: one pass at a time whoever asks, passes on change rather than
on a clock, and an app another placement held is taken over once its lease lapses."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import msgspec

from ground.appconfig import parse
from ground.registry import MachineRecord, WorkerStatus
from ground.registry.memory import MemoryRegistry
from placement.adapters.memory import MemoryLeaseStore
from placement.leases import LeaseKeeper
from placement.ports.leases import Lease
from placement.reconciling.passes import Passes, lease_name

APPS = [f"app{i:02d}" for i in range(50)]


class Reconcile:
    """A pass that observes, waits on `gate` (its reads), then acts on what it observed,
    as the reconciler does: two overlapping passes both see the old machine idle."""

    def __init__(self, unsettled: bool = False) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()
        self.busy: set[str] = set()
        self.actions: list[tuple[str, str]] = []
        self.runs: list[str] = []
        self.active = self.most_active = 0
        self.unsettled = unsettled

    async def __call__(self, app: str, lease: Lease) -> bool:
        self.runs.append(app)
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        self.entered.set()
        try:
            idle = "old" not in self.busy
            await self.gate.wait()
            if idle:
                self.busy.add("old")
                self.actions.append(("replace", "old"))
            return self.unsettled and len(self.runs) == 1
        finally:
            self.active -= 1


def passes_of(run: Reconcile, store: MemoryLeaseStore | None = None,
              registry: MemoryRegistry | None = None, period_s: float = 60.0,
              busy: set[str] | None = None, give_back_after_s: float = 60.0,
              new_worker: Callable[[str], bool] = lambda _: False,
              waking: set[str] | None = None) -> Passes:
    async def apps() -> list[str]:
        return list(APPS)

    working = busy if busy is not None else set()
    return Passes(run, apps, registry or MemoryRegistry(),
                  LeaseKeeper(store or MemoryLeaseStore(), 5.0), period_s=period_s,
                  new_worker=new_worker, forget=lambda _: None,
                  busy=lambda app: app in working, give_back_after_s=give_back_after_s,
                  waking=lambda app: app in (waking or set()))


async def until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "not within the deadline"
        await asyncio.sleep(0.01)


async def turns(n: int = 50) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def closing(passes: Passes, body: Callable[[], Awaitable[None]]) -> None:
    try:
        await body()
    finally:
        await passes.close()


async def test_pass_now_during_a_running_pass_waits_for_it_and_the_action_is_issued_once(
) -> None:
    run = Reconcile()
    passes = passes_of(run)

    async def body() -> None:
        run.gate.clear()
        passes.poke("app00")  # the feed's pass, held in its reads
        await run.entered.wait()
        deployed = asyncio.create_task(passes.pass_now("app00"))  # a deploy's
        await turns()
        assert run.active == 1 and not deployed.done()  # it waits; it does not overlap
        run.gate.set()
        assert await deployed is True
        assert run.most_active == 1
        assert run.runs == ["app00", "app00"]  # its own pass began after the first
        assert run.actions == [("replace", "old")]

    await closing(passes, body)


async def test_pass_now_when_another_placement_holds_the_lease_says_so_and_runs_nothing(
) -> None:
    store = MemoryLeaseStore()
    other = LeaseKeeper(store, 5.0)
    run = Reconcile()
    passes = passes_of(run, store)

    async def body() -> None:
        await other.acquire(lease_name("app00"))
        assert await passes.pass_now("app00") is False
        assert run.runs == [] and passes.taken == {"app00"}

    try:
        await closing(passes, body)
    finally:
        await other.close()


async def test_an_app_another_placement_held_is_passed_over_here_once_its_lease_is_free(
) -> None:
    store = MemoryLeaseStore()
    other = LeaseKeeper(store, 5.0)
    await other.acquire(lease_name("app07"))
    run = Reconcile()
    passes = passes_of(run, store)

    async def body() -> None:
        passes.start()
        await until(lambda: len(run.runs) == len(APPS) - 1 and "app07" in passes.taken)
        await other.close()  # the holder stops and gives its leases back
        await until(lambda: "app07" in run.runs)

    try:
        await closing(passes, body)
    finally:
        await other.close()


async def test_idle_apps_are_passed_over_once_at_start_then_only_on_change() -> None:
    registry = MemoryRegistry()
    run = Reconcile()
    passes = passes_of(run, registry=registry, period_s=0.05)

    async def body() -> None:
        passes.start()
        await until(lambda: len(run.runs) == len(APPS))
        await asyncio.sleep(1.0)  # 20 periods: a clock-driven pass would be 1,000 more
        assert len(run.runs) <= len(APPS) + 1  # the sweep: one app per 300 s / 50 apps
        before = len(run.runs)
        await registry.put_app(parse({"name": "app31", "image": "img"}))
        await until(lambda: len(run.runs) > before)
        assert run.runs[before:] == ["app31"]

    await closing(passes, body)


async def test_a_new_workers_heartbeat_on_the_workers_feed_passes_over_every_app() -> None:
    registry = MemoryRegistry()
    run = Reconcile()
    passes = passes_of(run, registry=registry, period_s=0.05,
                       new_worker=lambda worker: worker == "w-new")

    async def body() -> None:
        passes.start()
        await until(lambda: len(run.runs) == len(APPS))
        await asyncio.sleep(0.3)
        before = len(run.runs)
        status = WorkerStatus(id="w-old", epoch=1, region="local", url="http://w", cpus=1,
                              memory_mb=512, updated_at=0.0)
        await registry.publish_worker(status, ttl_s=5)  # a worker it knew: nothing
        await asyncio.sleep(0.3)
        assert len(run.runs) <= before + 1  # (the sweep's one app)
        await registry.publish_worker(msgspec.structs.replace(status, id="w-new"), ttl_s=5)
        await until(lambda: set(run.runs[before:]) >= set(APPS))

    await closing(passes, body)


def machine(app: str, state: str) -> MachineRecord:
    return MachineRecord(id=f"{app}-m", app=app, worker="w1", region="local", state=state,
                         image_digest="sha256:x", created_at=0.0, updated_at=0.0)


async def test_machine_changes_during_a_wake_here_ask_for_one_pass_when_it_ends() -> None:
    registry = MemoryRegistry()
    run = Reconcile()
    waking = {"app03"}
    passes = passes_of(run, registry=registry, waking=waking)

    async def body() -> None:
        passes.start()
        await until(lambda: len(run.runs) == len(APPS))
        before = len(run.runs)
        for state in ("starting", "started"):  # a wake's machine, as its agent reports it
            await registry.put_machine(machine("app03", state))
        await registry.put_machine(machine("app04", "started"))  # no wake of app04 here
        await until(lambda: "app04" in run.runs[before:])
        await asyncio.sleep(0.2)
        assert "app03" not in run.runs[before:]
        waking.clear()
        passes.woken("app03")
        await until(lambda: "app03" in run.runs[before:])
        await asyncio.sleep(0.2)
        assert run.runs[before:].count("app03") == 1
        passes.woken("app03")  # a wake with no change meanwhile: no pass
        await asyncio.sleep(0.2)
        assert run.runs[before:].count("app03") == 1

    await closing(passes, body)


async def test_a_wake_ending_after_the_passes_closed_asks_for_none() -> None:
    registry = MemoryRegistry()
    run = Reconcile()
    waking = {"app05"}
    passes = passes_of(run, registry=registry, waking=waking)
    passes.start()
    await until(lambda: len(run.runs) == len(APPS))
    await registry.put_machine(machine("app05", "starting"))
    await until(lambda: "app05" in passes.deferred)
    await passes.close()
    before = len(run.runs)
    passes.woken("app05")  # a wake that outlived the reconciler (shutdown)
    passes.poke("app06")
    await asyncio.sleep(0.2)
    assert len(run.runs) == before and not passes.tasks


async def test_an_app_whose_pass_found_something_to_do_is_looked_at_again_unasked() -> None:
    run = Reconcile(unsettled=True)
    passes = passes_of(run, period_s=0.05)

    async def body() -> None:
        passes.poke("app00")
        await until(lambda: len(run.runs) == 2)  # nothing changed: its own look again
        await asyncio.sleep(0.3)
        assert len(run.runs) == 2  # settled now: no more

    await closing(passes, body)


async def test_a_quiet_apps_lease_goes_back_and_a_busy_ones_is_kept() -> None:
    busy = {"app01"}
    run = Reconcile()
    passes = passes_of(run, busy=busy, give_back_after_s=0.1)

    async def body() -> None:
        passes.poke("app00")
        passes.poke("app01")
        await until(lambda: len(run.runs) == 2)
        assert set(passes.keeper.held) == {lease_name("app00"), lease_name("app01")}
        await until(lambda: set(passes.keeper.held) == {lease_name("app01")})
        await asyncio.sleep(0.3)
        assert set(passes.keeper.held) == {lease_name("app01")}  # its work goes on
        busy.clear()
        passes.poke("app01")  # its work ended: the action's end asks for a pass
        await until(lambda: not passes.keeper.held)

    await closing(passes, body)
