"""Placement gives each machine's worker its route ticket; the agent keeps it (op log) and
seals the machine's records with it; placement acts on sealed records only."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agent.runner import AgentRuntime
from ground.auth import tickets
from ground.registry.types import MachineRecord
from tests.support.credentials import ROUTE_KEYS
from tests.support.placement_helpers import Platform, eventually

pytestmark = pytest.mark.integration
HALF = {"cpus": 0.5, "memory_mb": 64}


async def wake(p: Platform, app: str) -> tuple[int, dict[str, Any]]:
    return await p.call("POST", f"/internal/apps/{app}/wake",
                        {"count": 1, "deadline_ms": 20_000})


async def record_of(p: Platform, app: str, machine_id: str) -> MachineRecord | None:
    return next((r for r in await p.registry.machines(app) if r.id == machine_id), None)


async def test_a_placed_machines_records_are_sealed_by_its_worker_and_survive_a_restart(
    tmp_path: Path, hello_layout: str,
) -> None:
    async with Platform(tmp_path, agents=1) as p:
        app = await p.create_app(name="x", image=hello_layout, guest=HALF)
        status, body = await wake(p, "x")
        assert status == 200, body
        machine = body["machines"][0]

        async def sealed_and_started() -> bool:
            found = await record_of(p, "x", machine["id"])
            return found is not None and found.state == "started"

        await eventually(sealed_and_started)
        found = await record_of(p, "x", machine["id"])
        assert found is not None and found.seal and found.worker == "w0"
        assert tickets.refusal(ROUTE_KEYS, found) is None
        ticket = tickets.ticket(ROUTE_KEYS, app["uid"], machine["id"], "w0")
        status, views = await p.call("GET", f"{p.agents[0].url}/v1/machines")
        assert status == 200 and ticket not in msgspec.json.encode(views).decode()
        assert ticket not in msgspec.json.encode(found).decode()  # the seal, not the ticket

        old = p.agents[0]
        await old.stop()  # stop_machines_on_exit: the machine stops with it
        p.agents[0] = AgentRuntime(old.config, p.registry)
        await p.agents[0].start()

        async def sealed_again() -> bool:
            again = await record_of(p, "x", machine["id"])
            return again is not None and again.epoch > found.epoch  # the new agent's

        await eventually(sealed_again)
        again = await record_of(p, "x", machine["id"])
        assert again is not None and tickets.refusal(ROUTE_KEYS, again) is None


async def test_a_wake_never_answers_with_a_forged_started_record(
    tmp_path: Path, hello_layout: str,
) -> None:
    """Records of the app that no ticket seals — unsealed, or sealed by the ticket of one of
    w1's own machines — are not the app's machines to placement: the wake places one (with
    them counted, max_machines=1 would leave nothing to start, and the wake would answer
    with them)."""
    async with Platform(tmp_path, agents=2) as p:
        app = await p.create_app(name="x", image=hello_layout, guest=HALF, max_machines=1)
        now = time.time()
        unsealed = MachineRecord(id="forged1", app="x", worker="w1", region="local",
                                 state="started", image_digest="", created_at=now,
                                 updated_at=now, address="127.0.0.1:9", app_uid=app["uid"])
        other_ticket = tickets.ticket(ROUTE_KEYS, "f" * 16, "m-of-w1", "w1")
        resealed = msgspec.structs.replace(unsealed, id="forged2")
        resealed = msgspec.structs.replace(
            resealed, seal=tickets.seal_record(other_ticket, resealed))
        for forged in (unsealed, resealed):
            await p.registry.put_machine(forged)
        status, body = await wake(p, "x")
        assert status == 200, body
        assert [m["id"] for m in body["machines"]] not in (["forged1"], ["forged2"])
        assert body["machines"][0]["address"] != "127.0.0.1:9"
        status, listed = await p.call("GET", "/v1/apps/x/machines")
        assert {m["id"] for m in listed}.isdisjoint({"forged1", "forged2"})
