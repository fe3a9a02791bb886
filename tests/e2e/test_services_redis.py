"""Every service as its own process, meeting in a real Redis: placement, two agents, edge."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent_process import call, find_machine_processes, kill_group, wait_until
from tests.support.credentials import ADMIN_TOKEN, ENV
from tests.support.ports import free_port, wait_for_port
from tests.support.redis_server import RedisServer, start_redis_server
from thaw.imagebuild import build_image

pytestmark = [pytest.mark.slow, pytest.mark.integration]

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"


class Services:
    def __init__(self, tmp: Path, redis_url: str) -> None:
        self.tmp = tmp
        self.redis_url = redis_url
        self.procs: list[subprocess.Popen[bytes]] = []
        self.api_port, self.edge_port, self.admin_port = free_port(), free_port(), free_port()
        self.api = f"http://127.0.0.1:{self.api_port}"

    def spawn(self, name: str, *args: str, port: int) -> None:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen([sys.executable, "-m", "thaw", *args, "--registry",
                                 self.redis_url, "--log-level", "warning"],
                                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **ENV})
        log.close()
        self.procs.append(proc)
        wait_for_port("127.0.0.1", port, timeout_s=20)

    def start(self) -> Services:
        layouts = ("--allow-layout", str(self.tmp))
        self.spawn("placement", "placement", "--port", str(self.api_port),
                   "--state-dir", str(self.tmp / "placement"), *layouts, port=self.api_port)
        for i in range(2):
            port = free_port()
            self.spawn(f"agent-{i}", "agent", "--port", str(port), "--id", f"w{i}",
                       "--state-dir", str(self.tmp / f"agent-{i}"), "--cpus", "2",
                       "--memory-mb", "1024", "--heartbeat-s", "0.5",
                       "--stop-machines-on-exit", *layouts, port=port)
        self.spawn("edge", "edge", "--port", str(self.edge_port), "--admin-port",
                   str(self.admin_port), "--placement", self.api, port=self.edge_port)
        return self

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        ids = {p.name for p in (self.tmp).glob("agent-*/machines/*")}
        for pid in find_machine_processes(ids):
            kill_group(pid)


@pytest.fixture
def redis_own() -> Iterator[RedisServer]:
    """A Redis of this test's own, so that the test may kill it."""
    with start_redis_server() as server:
        yield server


@pytest.fixture
def services(tmp_path: Path, redis_own: RedisServer) -> Iterator[Services]:
    running = Services(tmp_path, redis_own.url).start()
    try:
        yield running
    finally:
        running.stop()


def edge_get(services: Services, host: str) -> tuple[int, str, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", services.edge_port, timeout=30)
    try:
        conn.request("GET", "/", headers={"Host": host})
        response = conn.getresponse()
        return response.status, response.read().decode(), dict(response.getheaders())
    finally:
        conn.close()


def deploy_hello(services: Services, tmp_path: Path) -> str:
    """Create the app and wake it through the edge; returns the machine id."""
    build_image(HELLO, "hello:v1", layout=tmp_path / "layout")
    wait_until(lambda: len(call("GET", f"{services.api}/v1/workers", token=ADMIN_TOKEN)[1]) == 2,
               20)
    status, body = call("POST", f"{services.api}/v1/apps", token=ADMIN_TOKEN, body={
        "name": "hello", "image": f"oci:{tmp_path / 'layout'}:v1", "idle_timeout_s": 60,
        "guest": {"cpus": 0.5, "memory_mb": 128},
    })
    assert status == 201, body

    answers: list[tuple[int, str, dict[str, str]]] = []

    def edge_knows_the_app() -> bool:
        answers.append(edge_get(services, "hello.localhost"))
        return answers[-1][0] != 404

    wait_until(edge_knows_the_app, 10)  # the edge learns the app through the Redis feed
    status, body, headers = answers[-1]  # the first answer that was not a 404: cold
    assert status == 200 and body.startswith("hello from "), body
    machine_id = body.split()[-1]
    assert "hold;dur=" in headers.get("Server-Timing", "")
    status, body, headers = edge_get(services, "hello.localhost")
    assert status == 200 and body.split()[-1] == machine_id and "Server-Timing" not in headers
    _, machines = call("GET", f"{services.api}/v1/apps/hello/machines", token=ADMIN_TOKEN)
    started: list[dict[str, Any]] = [m for m in machines if m["state"] == "started"]
    assert [m["id"] for m in started] == [machine_id]
    return machine_id


def test_separate_processes_meeting_in_redis_wake_an_app_and_keep_serving_without_redis(
    services: Services, tmp_path: Path, redis_own: RedisServer
) -> None:
    machine_id = deploy_hello(services, tmp_path)
    kill_group(redis_own.pid)  # the registry dies; nothing on the warm path needs it
    for _ in range(20):
        status, body, _ = edge_get(services, "hello.localhost")
        assert status == 200 and body.split()[-1] == machine_id


def test_when_a_host_dies_the_next_request_is_served_by_a_machine_on_another_worker(
    services: Services, tmp_path: Path
) -> None:
    machine_id = deploy_hello(services, tmp_path)
    _, machines = call("GET", f"{services.api}/v1/apps/hello/machines", token=ADMIN_TOKEN)
    [machine] = [m for m in machines if m["id"] == machine_id]
    index = int(machine["worker"][1:])
    services.procs[1 + index].kill()  # kill -9 of the agent...
    services.procs[1 + index].wait()
    kill_group(machine["pid"])  # ...and of its machine: the host is gone
    status, body, _ = edge_get(services, "hello.localhost")
    assert status == 200 and body.startswith("hello from "), body
    assert body.split()[-1] != machine_id
    _, machines = call("GET", f"{services.api}/v1/apps/hello/machines", token=ADMIN_TOKEN)
    [survivor] = [m for m in machines if m["state"] == "started"]
    assert survivor["worker"] != machine["worker"]
