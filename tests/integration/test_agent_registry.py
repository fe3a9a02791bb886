"""An agent in this process publishes its truth to the registry it was handed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agent.config import AgentConfig
from agent.core.machine import MachineState
from agent.core.records import Guest, MachineSpec
from agent.core.state import Machine
from agent.runner import AgentRuntime
from agent.service import Agent
from ground.registry import MachineRecord
from ground.registry.memory import MemoryRegistry
from imagecache.core.egress import EgressPolicy
from tests.support.credentials import RING
from thaw.imagebuild import build_image

pytestmark = pytest.mark.integration

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def hello_started(tmp_path: Path, registry: MemoryRegistry,
                        **config: Any) -> AsyncIterator[tuple[Agent, Machine]]:
    """An agent in this process on `registry` with one machine of the hello image started
    (`config`: AgentConfig's fields beyond the test's own)."""
    build_image(HELLO, "hello:v1", layout=tmp_path / "layout")
    runtime = AgentRuntime(AgentConfig(
        state_dir=tmp_path / "agent", cluster_keys=RING,
        egress=EgressPolicy.build(layout_dirs=[str(tmp_path)]), cpus=2, memory_mb=1024,
        stop_machines_on_exit=True, **config), registry)
    await runtime.start()
    agent = runtime.agent
    assert agent is not None
    try:
        spec = MachineSpec(app="hello", image=f"oci:{tmp_path / 'layout'}:v1",
                           guest=Guest(cpus=0.5, memory_mb=128))
        machine = agent.offer("k1", spec, start=True)
        await agent.wait(machine.id, MachineState.STARTED, 20)
        yield agent, machine
    finally:
        await runtime.stop()


async def test_the_agent_publishes_its_heartbeat_layers_and_machine_records(
    tmp_path: Path,
) -> None:
    registry = MemoryRegistry()
    async with hello_started(tmp_path, registry, heartbeat_interval_s=0.2) as (agent, machine):

        async def published() -> bool:
            records = await registry.machines("hello")
            return bool(records) and records[0].state == "started"

        await eventually(published)
        [record] = await registry.machines("hello")
        assert record.address and record.worker == agent.worker_id and record.epoch == 1

        async def heartbeat_has_reservation_and_layers() -> bool:
            workers = await registry.workers("local")
            return (
                bool(workers)
                and workers[0].reserved_memory_mb == 128
                and workers[0].layers == agent.cache.layers()
            )

        await eventually(heartbeat_has_reservation_and_layers)
        [status] = await registry.workers("local")
        assert status.epoch == 1 and status.layers
        layer = next(iter(agent.cache.layers()))
        assert agent.worker_id in await registry.layer_holders(layer)

        agent.destroy(machine.id)

        async def record_deleted() -> bool:
            return await registry.machines("hello") == []

        await eventually(record_deleted)


class Recording(MemoryRegistry):
    """A registry that remembers every machine record written to it."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[MachineRecord] = []
        self.states: list[str] = []

    async def put_machine(self, record: MachineRecord) -> None:
        self.records.append(record)
        self.states.append(record.state)
        await super().put_machine(record)


@pytest.mark.parametrize("coalesce_s", [1.0, 0.0])
async def test_a_resume_is_one_registry_write_when_passing_states_are_held(
    tmp_path: Path, coalesce_s: float
) -> None:
    """A change to a passing state (here `starting`) waits `publish_coalesce_s` for the
    next: a resume's starting and started go out as one write (started); with no window
    each goes out on its own. A suspended machine's record keeps its address (its frozen
    app's socket listens: an edge that thaws it connects meanwhile)."""
    registry = Recording()
    async with hello_started(tmp_path, registry, heartbeat_interval_s=60,
                             publish_coalesce_s=coalesce_s) as (agent, machine):
        await agent.suspend(machine.id)

        async def last_is(state: str) -> bool:
            return bool(registry.states) and registry.states[-1] == state

        await eventually(lambda: last_is("suspended"))
        started = next(r for r in reversed(registry.records) if r.state == "started")
        assert registry.records[-1].address == started.address != ""
        before = len(registry.states)
        agent.start(machine.id)
        await agent.wait(machine.id, MachineState.STARTED, 20)
        await eventually(lambda: last_is("started"))
        resumed = registry.states[before:]
        assert resumed == (["started"] if coalesce_s else ["starting", "started"])


def test_the_coalescing_window_is_bounded(tmp_path: Path) -> None:
    for wrong in (-0.1, 1.5):
        with pytest.raises(ValueError, match="publish_coalesce_s"):
            AgentConfig(state_dir=tmp_path, cluster_keys=RING, publish_coalesce_s=wrong)
