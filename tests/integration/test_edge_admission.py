"""Deadline-aware admission end to end: a real placement (whose boot history says the
app boots slowly) predicts the start, streams it to a real edge, and the edge answers at
once the held request that cannot wait that long, while one that can is served."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from edge.config import EdgeConfig
from edge.runner import EdgeRuntime
from tests.support.credentials import RING
from tests.support.placement_helpers import Platform, eventually
from thaw.imagebuild import BuildOverrides, build_image

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ECHO = Path(__file__).resolve().parents[1] / "e2e" / "apps" / "echo"
BOOT_S = 2.0
HOLD_TIMEOUT_S = 20.0


@pytest.fixture
def slowboot(tmp_path: Path) -> str:
    layout = tmp_path / "slowboot-layout"  # beside the platform: its allowed layouts
    build_image(ECHO, "echo:slowboot", layout=layout, overrides=BuildOverrides(
        entrypoint=["python3", "app.py", "--boot-delay", str(BOOT_S)]))
    return f"oci:{layout}:slowboot"


@pytest.fixture
async def platform(tmp_path: Path) -> AsyncIterator[Platform]:
    async with Platform(tmp_path / "platform", agents=1) as running:
        yield running


async def get(session: aiohttp.ClientSession, edge: EdgeRuntime, timeout_s: str | None
              ) -> tuple[int, dict[str, str], str, float]:
    """(status, headers, body, seconds taken) of GET / on the slow app."""
    headers = {"Host": "slow.localhost"}
    if timeout_s is not None:
        headers["X-Request-Timeout"] = timeout_s
    began = time.monotonic()
    async with session.get(f"http://127.0.0.1:{edge.proxy_port}/", headers=headers) as reply:
        body = await reply.text()
        return reply.status, dict(reply.headers), body, time.monotonic() - began


async def test_a_request_whose_budget_is_below_the_predicted_start_gets_503_at_once(
    platform: Platform, slowboot: str,
) -> None:
    await platform.create_app(name="slow", image=slowboot, hold_timeout_s=HOLD_TIMEOUT_S,
                              auto_stop="stop", min_machines_running=0)
    edge = EdgeRuntime(EdgeConfig(placement_url=platform.url, port=0, admin_port=0,
                                  cluster_keys=RING), platform.registry)
    await edge.start()
    assert edge.edge is not None
    try:
        async with aiohttp.ClientSession() as session:
            # the first cold start teaches placement how long this app boots
            status, _, _, _ = await get(session, edge, None)
            assert status == 200
            [machine] = await platform.registry.machines("slow")
            status, body = await platform.call(
                "POST", f"/v1/apps/slow/machines/{machine.id}/stop", timeout_s=60)
            assert status == 200, body

            async def cold() -> bool:
                entry = edge.edge.view.apps.get("slow") if edge.edge else None
                return entry is not None and not entry.routable

            await eventually(cold, timeout_s=30)
            patient_task = asyncio.ensure_future(get(session, edge, "15"))
            hurried = await get(session, edge, "0.5")
            # one arriving while that prediction stands is refused on arrival
            arriving = await get(session, edge, "0.4")
            patient = await patient_task
    finally:
        await edge.stop()
    status, headers, body, took = hurried
    assert status == 503, body
    assert json.loads(body) == {
        "error": "predicted_late",
        "message": "the app is starting and will not be ready within this request's deadline"}
    assert 1 <= int(headers["Retry-After"]) <= HOLD_TIMEOUT_S
    assert patient[0] == 200, patient
    # answered before the machine was ready (so before the patient one) and long before the
    # hold timeout: not a 504 at its deadline
    assert took < patient[3] and took < HOLD_TIMEOUT_S
    assert arriving[0] == 503 and arriving[3] < patient[3], arriving
    assert edge.edge.cold.shed[("slow", "predicted_late")] == 2
