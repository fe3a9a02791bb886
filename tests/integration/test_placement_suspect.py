"""An edge reports a worker as suspect: placement looks for itself before counting it failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.placement_helpers import Platform

pytestmark = pytest.mark.integration


async def test_a_report_is_checked_by_a_probe_and_a_dead_agent_is_failed(tmp_path: Path) -> None:
    async with Platform(tmp_path, agents=2) as p:
        report = {"reporter": "edge-a", "machine": "m1", "address": "127.0.0.1:1",
                  "error": "ConnectionRefusedError(111)"}
        status, answer = await p.call("POST", "/internal/workers/w0/suspect", report)
        assert status == 200 and answer["failed"] is False, answer  # its agent answers
        status, _ = await p.call("POST", "/internal/workers/w0/suspect", report, signed=False)
        assert status == 401  # internal: signed calls only

        await p.agents[1].stop()  # w1's agent is gone, its heartbeat still fresh
        status, answer = await p.call("POST", "/internal/workers/w1/suspect", report)
        assert status == 200 and answer["failed"] is True, answer
        _, workers = await p.call("GET", "/v1/workers")
        [w1] = [w for w in workers if w["id"] == "w1"]
        assert w1["healthy"] is False and "does not answer" in w1["failed"]
        # a wake now only uses the live worker
        assert p.placement.placement is not None
        live = await p.placement.placement.fleet.live_workers()
        assert set(live) == {"w0"}

        # two edges about one machine: that machine died, not its host (the agent answers)
        await p.call("POST", "/internal/workers/w0/suspect", report)
        status, answer = await p.call("POST", "/internal/workers/w0/suspect",
                                      {**report, "reporter": "edge-b"})
        assert answer["failed"] is False, answer
        # two edges about two machines: independent evidence against the host
        status, answer = await p.call("POST", "/internal/workers/w0/suspect",
                                      {**report, "reporter": "edge-c", "machine": "m2"})
        assert answer["failed"] is True and "two edges" in answer["reason"], answer

        status, answer = await p.call("POST", "/internal/workers/w0/suspect",
                                      {**report, "reporter": "x" * 65})
        assert status == 422
