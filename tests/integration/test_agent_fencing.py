"""The agent refuses changes to an app's machines made under a reconcile lease older than
one it has seen (a placement paused past its lease), and remembers the newest token
across kill -9. A real agent process, signed calls with the token in the signed URL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.support.agent_process import AgentProcess, call

pytestmark = pytest.mark.integration
GUEST = {"cpus": 0.25, "memory_mb": 32}


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    running = AgentProcess(tmp_path / "agent").start()
    try:
        yield running
    finally:
        running.cleanup()


def offer(agent: AgentProcess, key: str, fence: str | None) -> tuple[int, Any]:
    query = f"?fence={quote(fence)}" if fence is not None else ""
    return call("POST", f"{agent.url}/v1/offers{query}",
                {"key": key, "app": "a", "image": "img", "guest": GUEST, "start": False})


def test_an_older_token_is_refused_a_newer_one_taken_and_both_outlive_kill_9(
    agent: AgentProcess,
) -> None:
    status, first = offer(agent, "k1", "200")
    assert status == 201, first
    mid = first["id"]
    status, body = call("POST", f"{agent.url}/v1/machines/{mid}/stop?fence=100")
    assert status == 409 and body["error"] == "stale_fence", body  # a stale holder
    status, body = offer(agent, "k2", "150")
    assert status == 409 and body["error"] == "stale_fence", body
    assert offer(agent, "k3", None)[0] == 201  # a wake claims no lease: not fenced
    assert offer(agent, "k4", "300")[0] == 201  # the lease's next holder
    agent.kill9()
    agent.start()
    status, body = offer(agent, "k5", "250")
    assert status == 409 and body["error"] == "stale_fence", body  # remembered
    status, body = call("DELETE", f"{agent.url}/v1/machines/{mid}?fence=300")
    assert status == 202 and body["state"] in ("destroying", "destroyed"), body


@pytest.mark.parametrize("fence", ["x", "-1", "١٢٣", "9" * 20])
def test_a_token_that_is_not_a_decimal_below_2_63_is_a_bad_request(
    agent: AgentProcess, fence: str,
) -> None:
    status, body = offer(agent, "k", fence)
    assert status == 400 and body["error"] == "bad_request", body
