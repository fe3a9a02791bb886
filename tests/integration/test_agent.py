"""The agent as a real process: offers, machines as real processes, restarts, cleanup."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ground.serving import DRAIN_S
from tests.support.agent_process import AgentProcess, call, pid_alive, wait_until
from tests.support.machines import frozen
from thaw.imagebuild import BuildOverrides, build_image

pytestmark = pytest.mark.integration

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The hello app in a local OCI layout."""
    layout = tmp_path_factory.mktemp("layout")
    build_image(HELLO, "hello:v1", layout=layout)
    return {"hello": f"oci:{layout}:v1"}


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    with AgentProcess(tmp_path / "agent", cpus=2, memory_mb=1024) as proc:  # cleaned up at the end
        yield proc


def offer(agent: AgentProcess, image: str, key: str, **extra: Any) -> tuple[int, Any]:
    body = {"key": key, "app": "hello", "image": image,
            "guest": {"cpus": 0.5, "memory_mb": 128}, **extra}
    return call("POST", f"{agent.url}/v1/offers", body)


def get(url: str) -> tuple[int, Any]:
    return call("GET", url)


def start_hello(agent: AgentProcess, image: str, key: str = "k1") -> dict[str, Any]:
    status, machine = offer(agent, image, key)
    assert status == 201, machine
    return agent.wait_state(machine["id"], "started")


def test_an_offered_machine_starts_and_answers_http_on_its_allocated_port(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    machine = start_hello(agent, images["hello"])
    status, body = get(f"http://{machine['address']}/")
    assert status == 200 and machine["id"] in body
    status, logs = get(f"{agent.url}/v1/machines/{machine['id']}/logs")
    assert status == 200 and f"hello {machine['id']} listening" in logs


def test_kill_9_of_the_agent_leaves_the_machine_running_and_the_restarted_agent_adopts_it(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    machine = start_hello(agent, images["hello"])
    _, before = get(f"{agent.url}/v1/status")
    agent.kill9()
    assert pid_alive(machine["pid"])
    agent.start()
    status, after = get(f"{agent.url}/v1/machines/{machine['id']}")
    assert status == 200
    assert after["state"] == "started" and after["pid"] == machine["pid"]
    assert [e["event"] for e in after["events"]] == [e["event"] for e in machine["events"]]
    status, body = get(f"http://{after['address']}/")
    assert status == 200 and machine["id"] in body
    _, status_after = get(f"{agent.url}/v1/status")
    assert status_after["epoch"] == before["epoch"] + 1


def test_kill_9_of_a_machine_process_makes_the_agent_restart_it(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    machine = start_hello(agent, images["hello"])
    os.killpg(machine["pid"], signal.SIGKILL)

    def restarted() -> bool:
        _, current = get(f"{agent.url}/v1/machines/{machine['id']}")
        return current["state"] == "started" and current["pid"] != machine["pid"]

    wait_until(restarted, timeout_s=15)
    _, current = get(f"{agent.url}/v1/machines/{machine['id']}")
    assert "crash" in [e["event"] for e in current["events"]]
    status, body = get(f"http://{current['address']}/")
    assert status == 200 and machine["id"] in body


def test_a_machine_that_keeps_crashing_ends_failed_with_a_reason(
    agent: AgentProcess, tmp_path: Path
) -> None:
    layout = tmp_path / "crash-layout"
    (tmp_path / "crash").mkdir()
    (tmp_path / "crash" / "crash.py").write_text("import sys\nprint('boom')\nsys.exit(3)\n")
    build_image(tmp_path / "crash", "crasher:v1", layout=layout,
                overrides=BuildOverrides(entrypoint=["python3", "crash.py"],
                                         base="builtin:python3"))
    status, machine = offer(agent, f"oci:{layout}:v1", "crash-key")
    assert status == 201
    failed = agent.wait_state(machine["id"], "failed", timeout_s=30)
    assert "crashed" in failed["events"][-1]["reason"]
    assert sum(e["event"] == "crash" for e in failed["events"]) >= 4
    _, logs = get(f"{agent.url}/v1/machines/{machine['id']}/logs")
    assert "boom" in logs


def test_offers_beyond_capacity_are_declined_with_no_capacity_but_spares_are_taken(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    big = {"guest": {"cpus": 1, "memory_mb": 256}, "start": True}  # 2 of them fill it
    assert offer(agent, images["hello"], "a", **big)[0] == 201
    assert offer(agent, images["hello"], "b", **big)[0] == 201
    status, body = offer(agent, images["hello"], "c", **big)
    assert status == 409 and body["error"] == "no_capacity"
    spare = {**big, "start": False, "spare": True}  # a standby needs no room until it runs
    status, standby = offer(agent, images["hello"], "d", **spare)
    assert status == 201, standby
    status, body = call("POST", f"{agent.url}/v1/machines/{standby['id']}/start")
    assert status == 409 and body["error"] == "no_capacity"  # and cannot start while full
    _, machines = get(f"{agent.url}/v1/machines")
    assert len(machines) == 3


def test_the_same_offer_key_twice_creates_one_machine(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    first = offer(agent, images["hello"], "same", start=False)
    second = offer(agent, images["hello"], "same", start=False)
    assert first[0] == 201 and second[0] == 200
    assert first[1]["id"] == second[1]["id"]
    _, machines = get(f"{agent.url}/v1/machines")
    assert len(machines) == 1


def test_an_illegal_transition_is_409_naming_both_states(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    _, machine = offer(agent, images["hello"], "k", start=False)
    status, body = call("POST", f"{agent.url}/v1/machines/{machine['id']}/stop")
    assert status == 409 and body["error"] == "illegal_transition"
    assert "stop" in body["message"] and "created" in body["message"]


def test_stop_suspend_resume_and_destroy_leave_no_process_behind(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    machine = start_hello(agent, images["hello"])
    mid, url = machine["id"], f"{agent.url}/v1/machines/{machine['id']}"
    status, suspended = call("POST", f"{url}/suspend")
    assert status == 200 and suspended["state"] == "suspended"
    assert frozen(machine["pid"])
    call("POST", f"{url}/start")
    resumed = agent.wait_state(mid, "started")
    assert resumed["pid"] == machine["pid"]  # the same process, thawed
    assert get(f"http://{resumed['address']}/")[0] == 200
    call("POST", f"{url}/stop")
    agent.wait_state(mid, "stopped")
    wait_until(lambda: not pid_alive(machine["pid"]))
    call("POST", f"{url}/start")
    restarted = agent.wait_state(mid, "started")
    assert restarted["pid"] != machine["pid"]
    status, _ = call("DELETE", url)
    assert status == 202
    wait_until(lambda: get(url)[0] == 404)
    assert not pid_alive(restarted["pid"])
    assert agent.machine_pids() == []


def test_wait_reports_a_timeout_as_408_and_unknown_machines_as_404(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    _, machine = offer(agent, images["hello"], "k", start=False)
    status, body = get(f"{agent.url}/v1/machines/{machine['id']}/wait?state=started&timeout_s=0.2")
    assert status == 408 and body["error"] == "timeout"
    assert get(f"{agent.url}/v1/machines/nope")[0] == 404


def test_sigterm_ends_a_long_wait_with_503_and_the_agent_stops_at_once(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    """A caller's wait (up to 300 s) must not hold the agent's stop: it is answered 503
    shutting_down, and the agent exits (aiohttp alone would wait up to 60 s for it)."""
    _, machine = offer(agent, images["hello"], "k", start=False)
    answers: list[tuple[int, Any]] = []
    waiter = threading.Thread(target=lambda: answers.append(get(
        f"{agent.url}/v1/machines/{machine['id']}/wait?state=started&timeout_s=120")))
    waiter.start()
    time.sleep(0.3)  # the wait is in flight
    assert agent.proc is not None
    agent.proc.terminate()
    agent.proc.wait(timeout=DRAIN_S + 5)  # TimeoutExpired when the wait holds the stop
    agent.proc = None
    waiter.join(10)
    [(status, body)] = answers
    assert status == 503 and body["error"] == "shutting_down", body


def test_an_invalid_offer_is_422_naming_the_field(agent: AgentProcess) -> None:
    status, body = offer(agent, "oci:/nowhere:v1", "k", kill_signal="SIGNOPE")
    assert status == 422 and "kill_signal" in body["message"]
    status, body = call("POST", f"{agent.url}/v1/offers", {"key": "k", "app": "a"})
    assert status == 422 and "image" in body["message"]



def test_an_image_pushed_with_thaw_image_build_to_a_real_registry_runs_as_a_machine(
    tmp_path: Path, docker_registry: Any
) -> None:
    agent = AgentProcess(tmp_path / "agent", extra=["--allow-registry", docker_registry.host])
    with contextlib.closing(agent.start()) as agent:
        pull_and_run_pushed_hello(agent, docker_registry)
    refused = AgentProcess(tmp_path / "strict")  # the registry is on loopback: not by default
    with contextlib.closing(refused.start()):
        status, answer = call("POST", f"{refused.url}/v1/images/pull",
                              {"ref": f"{docker_registry.host}/hello:pushed"})
        assert (status, answer["error"]) == (403, "forbidden_host"), answer


def pull_and_run_pushed_hello(agent: AgentProcess, docker_registry: Any) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "thaw", "image", "build", str(HELLO), "-t", "hello:pushed",
         "--push", docker_registry.url],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert built.returncode == 0, built.stderr
    digest = built.stdout.strip().split()[-1]
    assert digest.startswith("sha256:")
    status, pulled = call("POST", f"{agent.url}/v1/images/pull",
                          {"ref": f"{docker_registry.host}/hello:pushed"})
    assert status == 200 and pulled["digest"] == digest
    machine = start_hello(agent, f"{docker_registry.host}/hello:pushed")
    assert machine["image_digest"] == digest
    status, body = get(f"http://{machine['address']}/")
    assert status == 200 and f"hello from {machine['id']}" in body


def test_a_machine_whose_entrypoint_does_not_exist_fails_with_a_reason(
    tmp_path: Path,
) -> None:
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "x.txt").write_text("x")
    build_image(app_dir, "nope:v1", layout=tmp_path / "layout",
                overrides=BuildOverrides(entrypoint=["/no/such/binary"]))
    agent = AgentProcess(tmp_path / "agent").start()
    try:
        status, machine = offer(agent, f"oci:{tmp_path / 'layout'}:v1", "k")
        assert status == 201
        failed = agent.wait_state(machine["id"], "failed")
        # the OCI runtime refuses it at create; under bubblewrap it is an exit, then a loop
        assert failed["events"][-1]["reason"].startswith(("start_failed", "crashed"))
        assert "/no/such/binary" in failed["events"][-1]["reason"]
    finally:
        agent.cleanup()


def test_start_with_wait_accepts_a_machine_already_started_and_plain_start_refuses_it(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    machine = start_hello(agent, images["hello"])
    url = f"{agent.url}/v1/machines/{machine['id']}/start"
    status, body = call("POST", url)
    assert status == 409 and "started" in body["message"]
    status, body = call("POST", f"{url}?wait_s=5")
    assert status == 200 and body["state"] == "started" and body["pid"] == machine["pid"]
