"""Capacity follows what runs: idle apps hold nothing, and a worker with no room for a
stopped machine declines to start it, while another machine serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ground.registry.types import WorkerFacts
from tests.support.placement_helpers import Platform, eventually

pytestmark = pytest.mark.integration
HALF = {"cpus": 0.5, "memory_mb": 64}


async def wake(p: Platform, app: str) -> dict[str, Any]:
    status, woke = await p.call("POST", f"/internal/apps/{app}/wake",
                                {"count": 1, "deadline_ms": 20_000})
    assert status == 200, woke
    machine: dict[str, Any] = woke["machines"][0]
    return machine


async def autostop(p: Platform, app: str, machine_id: str) -> None:
    status, body = await p.call("POST", f"/internal/apps/{app}/machines/{machine_id}/autostop",
                                {"idle_s": 60})
    assert status == 200, body
    status, body = await p.call(
        "GET", f"/v1/apps/{app}/machines/{machine_id}/wait?state=stopped&timeout_s=10")
    assert status == 200, body


async def reserved(p: Platform) -> list[tuple[float, int, int]]:
    _, workers = await p.call("GET", "/v1/workers")
    return [(w["reserved_cpus"], w["reserved_memory_mb"], w["machines_running"])
            for w in workers]


@pytest.mark.slow
async def test_twenty_apps_woken_one_after_another_on_three_one_cpu_workers_all_answer(
    tmp_path: Path, hello_layout: str
) -> None:
    """Each auto-stopped before the next: stopped machines hold nothing, so the 20th app
    finds as much room as the first (before, the 7th was refused for good)."""
    async with Platform(tmp_path, agents=3, cpus=1) as p:
        for i in range(20):
            await p.create_app(name=f"app{i}", image=hello_layout, guest=HALF)
            machine = await wake(p, f"app{i}")
            await autostop(p, f"app{i}", machine["id"])
        async def nothing_held() -> bool:  # as the next heartbeats say
            return await reserved(p) == [(0.0, 0, 0)] * 3

        await eventually(nothing_held)  # nothing runs: nothing is held
        assert p.machine_count() == 20  # the stopped machines are all still there


async def test_a_stopped_machine_on_a_full_worker_is_not_started_there_another_serves(
    tmp_path: Path, hello_layout: str
) -> None:
    async with Platform(tmp_path, agents=2, cpus=1) as p:
        await p.create_app(name="x", image=hello_layout, guest=HALF)
        first = await wake(p, "x")
        await autostop(p, "x", first["id"])
        full = next(a for a in p.agents if a.agent is not None
                    and a.agent.worker_id == first["worker"])
        for i in range(2):  # another app's machines take all of that worker
            status, made = await p.call("POST", full.url + "/v1/offers", {
                "key": f"filler-{i}", "app": "filler", "image": hello_layout, "guest": HALF,
                "start": True})
            assert status == 201, made
        status, refused = await p.call("POST", f"{full.url}/v1/machines/{first['id']}/start")
        assert (status, refused["error"]) == (409, "no_capacity")  # the worker declines
        second = await wake(p, "x")
        assert second["id"] != first["id"] and second["worker"] != first["worker"]
        status, machines = await p.call("GET", "/v1/apps/x/machines")
        states = {m["id"]: m["state"] for m in machines}
        assert states[first["id"]] == "stopped"  # left as it was, for the reconciler


async def test_placement_and_each_agent_say_the_same_facts_of_a_worker(
    tmp_path: Path, hello_layout: str
) -> None:
    """Placement's `/v1/workers` is each agent's `/v1/status` as heard in its heartbeats:
    one set of facts (ground/registry/types.py WorkerFacts), built once by the agent."""
    async with Platform(tmp_path, agents=2, cpus=1) as p:
        await p.create_app(name="facts", image=hello_layout, guest=HALF)
        await wake(p, "facts")
        facts = WorkerFacts.__struct_fields__

        async def agree() -> bool:
            _, workers = await p.call("GET", "/v1/workers")
            for worker in workers:
                _, status = await p.call("GET", worker["url"] + "/v1/status")
                if {k: worker[k] for k in facts} != {k: status[k] for k in facts}:
                    return False
            return len(workers) == 2 and sum(w["machines_running"] for w in workers) == 1

        await eventually(agree)
