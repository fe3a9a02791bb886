"""A real `thaw agent` answers only calls signed with the cluster key and meant for it."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from ground.auth.signing import KeyRing
from tests.support.agent_process import AgentProcess
from tests.support.credentials import CLUSTER_KEY, RING, signed_headers

pytestmark = pytest.mark.integration
NEW_KEY = "n" * 40


def send(url: str, method: str = "GET", body: bytes = b"",
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request(method, target, body=body or None, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    return response.status, json.loads(data) if data.startswith(b"{") or data.startswith(
        b"[") else data.decode()


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    # rotating: the new key signs, the test suite's (previous) key is still accepted
    running = AgentProcess(tmp_path_factory.mktemp("agent") / "state",
                           env={"THAW_CLUSTER_KEY": f"{NEW_KEY},{CLUSTER_KEY}"}).start()
    try:
        yield running
    finally:
        running.cleanup()


def test_every_agent_route_refuses_an_unsigned_call_and_does_nothing(
    agent: AgentProcess,
) -> None:
    offer = json.dumps({"key": "k1", "app": "a", "image": "img"}).encode()
    for method, path, body in [("GET", "/v1/machines", b""), ("GET", "/v1/status", b""),
                               ("POST", "/v1/offers", offer),
                               ("POST", "/v1/images/pull", b'{"ref": "img"}'),
                               ("DELETE", "/v1/machines/x", b""),
                               ("GET", "/v1/machines/x/logs", b"")]:
        status, answer = send(agent.url + path, method, body)
        assert status == 401 and answer["error"] == "unauthorized", (path, answer)
    status, machines = send(agent.url + "/v1/machines", headers=signed_headers(
        "GET", agent.url + "/v1/machines"))
    assert status == 200 and machines == []  # the unsigned offer made nothing
    assert send(agent.url + "/healthz")[0] == 200  # liveness and metrics stay open
    assert send(agent.url + "/metrics")[0] == 200


def test_a_stale_replayed_tampered_or_misaddressed_signature_is_refused(
    agent: AgentProcess,
) -> None:
    url = agent.url + "/v1/machines?app=a"
    stale = signed_headers("GET", url, now=time.time() - 31)
    assert send(url, headers=stale)[0] == 401
    good = signed_headers("GET", url)
    assert send(url, headers=good)[0] == 200
    assert send(url, headers=good)[0] == 401  # replayed
    other_query = signed_headers("GET", agent.url + "/v1/machines?app=b")
    assert send(url, headers=other_query)[0] == 401
    body = json.dumps({"ref": "img"}).encode()
    signed = signed_headers("POST", agent.url + "/v1/images/pull", body)
    assert send(agent.url + "/v1/images/pull", "POST", b'{"ref": "other"}', signed)[0] == 401
    # signed for another agent's address: refused even though the key is right
    elsewhere = signed_headers("GET", "http://127.0.0.1:1/v1/machines?app=a")
    assert send(url, headers={**elsewhere, "Host": "127.0.0.1:1"})[0] == 401


def test_during_rotation_both_the_new_and_the_previous_key_are_accepted(
    agent: AgentProcess,
) -> None:
    url = agent.url + "/v1/status"
    assert send(url, headers=signed_headers("GET", url, ring=RING))[0] == 200
    assert send(url, headers=signed_headers("GET", url, ring=KeyRing.parse(NEW_KEY)))[0] == 200
    unknown = signed_headers("GET", url, ring=KeyRing.parse("u" * 40))
    assert send(url, headers=unknown)[0] == 401


def test_a_call_captured_before_an_agent_restart_cannot_be_replayed_after_it(
    tmp_path: Path,
) -> None:
    agent = AgentProcess(tmp_path / "state").start()
    try:
        url = agent.url + "/v1/status"
        captured = signed_headers("GET", url)
        assert send(url, headers=captured)[0] == 200
        agent.terminate()
        time.sleep(1.1)  # the restart is in a later second than the capture
        agent.start()
        assert send(url, headers=captured)[0] == 401  # fresh replay cache, still refused
        assert send(url, headers=signed_headers("GET", url))[0] == 200
    finally:
        agent.cleanup()


def test_an_agent_without_a_cluster_key_refuses_to_start(tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path / "state", env={"THAW_CLUSTER_KEY": ""})
    with pytest.raises(RuntimeError):
        agent.start()
    assert "no cluster key" in agent.log_path.read_text()
    agent.cleanup()
