"""Every service as its own process, meeting in a real Redis: placement, two agents, edge."""

from __future__ import annotations

import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from ground.registry import keys
from tests.support.agent_process import call, kill_group, wait_until
from tests.support.credentials import ADMIN_TOKEN
from tests.support.load import SteadyLoad
from tests.support.redis_server import RedisServer, start_redis_server
from tests.support.services import Services, app_machines, edge_get
from thaw.imagebuild import BuildOverrides, build_image

pytestmark = [pytest.mark.slow, pytest.mark.integration]

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"


@pytest.fixture
def services(tmp_path: Path, redis_own: RedisServer) -> Iterator[Services]:
    with Services(tmp_path, redis_own.url) as running:
        yield running


@pytest.fixture
def services3(tmp_path: Path, redis_own: RedisServer) -> Iterator[Services]:
    """Three workers: a lost host still leaves two to spread the app over."""
    running = Services(tmp_path, redis_own.url, agents=3).start()
    try:
        yield running
    finally:
        running.stop()


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
    services.kill_host(int(machine["worker"][1:]))  # the agent and its machine: a host lost
    status, body, _ = edge_get(services, "hello.localhost")
    assert status == 200 and body.startswith("hello from "), body
    assert body.split()[-1] != machine_id
    _, machines = call("GET", f"{services.api}/v1/apps/hello/machines", token=ADMIN_TOKEN)
    [survivor] = [m for m in machines if m["state"] == "started"]
    assert survivor["worker"] != machine["worker"]


def test_redis_restarted_empty_under_warm_load_loses_no_app_and_no_request(
    services: Services, tmp_path: Path, redis_own: RedisServer
) -> None:
    machine_id = deploy_hello(services, tmp_path)
    with SteadyLoad(services.edge_port, "hello.localhost", rate=40) as load:
        time.sleep(1.0)
        kill_group(redis_own.pid)
        time.sleep(2.0)
        with start_redis_server(port=redis_own.port):
            back = time.monotonic()
            fresh = redis.Redis.from_url(redis_own.url)
            wait_until(lambda: fresh.hexists("thaw:apps", "hello"), 5)
            wait_until(lambda: fresh.hlen("thaw:machines:hello") == 1, 5)
            fresh.close()
            republished_s = time.monotonic() - back
            # until the edge's view is authoritative again (placement marked the refill
            # done), and a little more: no 404 from its first pruning load either
            wait_until(lambda: fresh_marker(redis_own.url), 30)
            time.sleep(2)
            _, machines = call("GET", f"{services.api}/v1/apps/hello/machines",
                               token=ADMIN_TOKEN)
    answers = load.answers
    codes = Counter(a.status for a in answers)
    assert 404 not in codes, codes
    assert codes[200] / len(answers) >= 0.999, codes
    assert {a.body.split()[-1] for a in answers if a.status == 200} == {machine_id}
    assert [(m["id"], m["state"]) for m in machines] == [(machine_id, "started")]
    assert republished_s < 5


def fresh_marker(url: str) -> bool:
    """A placement marked the current generation republished (the edges prune again)."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        generation = client.get(keys.generation())
        return generation is not None and client.get(keys.republished()) == generation
    finally:
        client.close()


def test_with_a_user_and_an_acl_per_role_the_services_wake_an_app_and_no_agent_can_reroute_it(
    tmp_path: Path,
) -> None:
    """... and the edge resumes its suspended machine through the machine's agent itself
    (its user reads that worker's heartbeat; the agent's answer is sealed)."""
    with start_redis_server(locked=True, workers=("w0", "w1")) as locked:
        services = Services(tmp_path, "", locked=locked).start()
        try:
            machine_id = deploy_hello(services, tmp_path)
            agent = redis.Redis.from_url(locked.url_of("agent-w0"))
            for write in (lambda: agent.hset("thaw:apps", "hello", "{}"),
                          lambda: agent.set("thaw:worker:w1", "{}"),
                          lambda: agent.hgetall("thaw:apps")):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    write()
            agent.close()
            status, body, _ = edge_get(services, "hello.localhost")
            assert status == 200 and body.split()[-1] == machine_id
            resumed_by_the_edge(services, "hello", machine_id)
        finally:
            services.stop()
        logs = "".join(log.read_text() for log in tmp_path.glob("*.log"))
        assert "NOPERM" not in logs and "no permissions" not in logs, logs
        assert locked.passwords["edge"] not in logs


def resumed_by_the_edge(services: Services, app: str, machine_id: str) -> None:
    """`app` set to suspend when idle: the edge auto-stops its machine (a suspend), then
    one request resumes it — the edge's own thaw, not a second machine."""
    status, body = call("PATCH", f"{services.api}/v1/apps/{app}", token=ADMIN_TOKEN,
                        body={"auto_stop": "suspend", "idle_timeout_s": 1})
    assert status == 200, body
    admin = f"http://127.0.0.1:{services.admin_ports[0]}"

    def auto_suspended() -> bool:  # as the edge sees it: a machine it may thaw
        seen = call("GET", f"{admin}/v1/state")[1]["apps"][app]
        return not seen["machines"] and seen["resting"] == {machine_id: "suspended"}

    wait_until(auto_suspended, 30)
    status, body, headers = edge_get(services, f"{app}.localhost")
    assert status == 200 and body.split()[-1] == machine_id, body
    assert "hold;dur=" in headers.get("Server-Timing", "")
    metrics = urllib.request.urlopen(f"{admin}/metrics", timeout=10).read().decode()
    assert 'thaw_edge_direct_thaws_total{result="thawed"} 1.0' in metrics
    assert [m["id"] for m in app_machines(services, app)] == [machine_id]


def shaped(machines: list[dict[str, Any]], avoid: str = "") -> bool:
    """One started machine and one spare, on two workers, none on `avoid`."""
    states = sorted(m["state"] for m in machines)
    workers = {m["worker"] for m in machines}
    return states == ["created", "started"] and len(workers) == 2 and avoid not in workers


def test_with_a_spare_a_host_killed_under_load_fails_no_request_and_the_shape_returns(
    services3: Services, tmp_path: Path
) -> None:
    services = services3
    build_image(HELLO, "hello:v1", layout=tmp_path / "layout")
    wait_until(lambda: len(call("GET", f"{services.api}/v1/workers", token=ADMIN_TOKEN)[1]) == 3,
               20)
    status, body = call("POST", f"{services.api}/v1/apps", token=ADMIN_TOKEN, body={
        "name": "hello", "image": f"oci:{tmp_path / 'layout'}:v1", "idle_timeout_s": 300,
        "min_machines_running": 1, "spares": 1, "guest": {"cpus": 0.5, "memory_mb": 128},
    })
    assert status == 201, body
    wait_until(lambda: shaped(app_machines(services)), 30)
    wait_until(lambda: edge_get(services, "hello.localhost")[0] == 200, 10)
    [victim] = [m for m in app_machines(services) if m["state"] == "started"]
    [spare] = [m for m in app_machines(services) if m["state"] == "created"]
    lost = victim["worker"]
    with SteadyLoad(services.edge_port, "hello.localhost", rate=40) as load:
        time.sleep(1.5)
        killed_at = time.monotonic()
        services.kill_host(int(lost[1:]))
        wait_until(lambda: shaped(app_machines(services), avoid=lost), 15)
        restored_s = time.monotonic() - killed_at
        time.sleep(1.5)
    codes = Counter(a.status for a in load.answers)
    assert codes == Counter({200: len(load.answers)}), codes
    # every request sent after the kill was served by the spare, started on its worker
    assert {a.body.split()[-1] for a in load.between(killed_at + 0.05)} == {spare["id"]}
    assert restored_s < 15
    print(f"restored in {restored_s:.2f}s; {len(load.answers)} requests, all 200; slowest "
          f"{max(a.seconds for a in load.answers) * 1000:.0f} ms")

    # the dead host's agent comes back: its machine was replaced, so it is destroyed
    services.restart(f"agent-{lost[1:]}")
    wait_until(lambda: services.destroyed_on(lost, "hello", victim["id"]), 20)
    assert shaped(app_machines(services), avoid=lost)
    status, _, _ = edge_get(services, "hello.localhost")
    assert status == 200


def test_killing_the_only_machine_under_load_answers_no_502(
    services: Services, tmp_path: Path
) -> None:
    machine_id = deploy_hello(services, tmp_path)
    [machine] = [m for m in app_machines(services) if m["id"] == machine_id]
    with SteadyLoad(services.edge_port, "hello.localhost", rate=40) as load:
        time.sleep(1.5)
        killed_at = time.monotonic()
        kill_group(machine["pid"])
        wait_until(lambda: any(a.status == 200 for a in load.between(killed_at + 0.5)), 20)
        time.sleep(2.0)
    codes = Counter(a.status for a in load.answers)
    others = [a for a in load.answers if a.status != 200]  # said when it fails: which and why
    assert 502 not in codes and codes[200] == len(load.answers), (codes, others)


def test_a_rolling_deploy_under_load_fails_no_request_and_leaves_only_the_new_release(
    services3: Services, tmp_path: Path
) -> None:
    services = services3
    build_image(HELLO, "hello:v1", layout=tmp_path / "v1")
    build_image(HELLO, "hello:v2", layout=tmp_path / "v2",
                overrides=BuildOverrides(env={"GREETING": "hi"}))
    wait_until(lambda: len(call("GET", f"{services.api}/v1/workers", token=ADMIN_TOKEN)[1]) == 3,
               20)
    status, body = call("POST", f"{services.api}/v1/apps", token=ADMIN_TOKEN, body={
        "name": "hello", "image": f"oci:{tmp_path / 'v1'}:v1", "idle_timeout_s": 300,
        "min_machines_running": 2, "spares": 1, "max_machines": 5,
        "health": {"path": "/healthz", "timeout_s": 5},
        "guest": {"cpus": 0.25, "memory_mb": 64},
    })
    assert status == 201, body

    def on_release(version: int) -> bool:
        found = app_machines(services)
        _, releases = call("GET", f"{services.api}/v1/apps/hello/releases", token=ADMIN_TOKEN)
        return (sorted(m["state"] for m in found) == ["created", "started", "started"]
                and all(m["release"] == version for m in found)
                and releases[0]["version"] == version and releases[0]["status"] == "complete")

    wait_until(lambda: on_release(1), 30)
    wait_until(lambda: edge_get(services, "hello.localhost")[0] == 200, 10)
    with SteadyLoad(services.edge_port, "hello.localhost", rate=40) as load:
        time.sleep(1.0)
        status, deployed = call("POST", f"{services.api}/v1/apps/hello/deploy",
                                token=ADMIN_TOKEN, body={"image": f"oci:{tmp_path / 'v2'}:v2"})
        assert status == 200 and deployed["release"]["version"] == 2, deployed
        wait_until(lambda: on_release(2), 60)
        done_at = time.monotonic()
        time.sleep(1.5)
    codes = Counter(a.status for a in load.answers)
    assert codes == Counter({200: len(load.answers)}), codes
    greetings = [a.body.split()[0] for a in load.answers]
    assert greetings[0] == "hello" and greetings[-1] == "hi"
    assert {a.body.split()[0] for a in load.between(done_at + 0.5)} == {"hi"}
    digest = deployed["app"]["image_digest"]
    assert all(m["image_digest"] in ("", digest) for m in app_machines(services))
