"""An agent in this process publishes its truth to the registry it was handed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.core.machine import MachineState
from agent.core.records import Guest, MachineSpec
from agent.runner import AgentRuntime
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


async def test_the_agent_publishes_its_heartbeat_layers_and_machine_records(
    tmp_path: Path,
) -> None:
    build_image(HELLO, "hello:v1", layout=tmp_path / "layout")
    registry = MemoryRegistry()
    config = AgentConfig(state_dir=tmp_path / "agent", cluster_keys=RING,
                         egress=EgressPolicy.build(layout_dirs=[str(tmp_path)]), cpus=2,
                         memory_mb=1024, heartbeat_interval_s=0.2, stop_machines_on_exit=True)
    runtime = AgentRuntime(config, registry)
    await runtime.start()
    agent = runtime.agent
    assert agent is not None
    try:
        spec = MachineSpec(app="hello", image=f"oci:{tmp_path / 'layout'}:v1",
                           guest=Guest(cpus=0.5, memory_mb=128))
        machine = agent.offer("k1", spec, start=True)
        await agent.wait(machine.id, MachineState.STARTED, 20)

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
    finally:
        await runtime.stop()
