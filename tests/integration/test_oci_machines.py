"""Machines as OCI containers (the OCI driver, runc): an image runs as itself, a tenant
cannot get out, the reservation is what the kernel enforces, writes stay in the machine's
own layer, and every lifecycle step works on containers. Real agent, real runc, a probe
app that reports from inside (tests/e2e/apps/probe)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.core.ocispec import DEFAULT_CAPABILITIES
from agent.oci.cgroups import controller_dir, cpu_usage_s
from tests.support.agent_process import AgentProcess, call, pid_alive, wait_until
from tests.support.machines import frozen, oci_driver_runs
from thaw.imagebuild import BuildOverrides, build_image

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not oci_driver_runs(),
                       reason="the OCI driver needs root and runc (THAW_TEST_DRIVER=auto|oci)"),
]
PROBE = Path(__file__).resolve().parents[1] / "e2e" / "apps" / "probe"
MARKER = "this file is in the probe image only\n"
GUEST = {"cpus": 0.5, "memory_mb": 128}
CAP_BITS = {"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_FOWNER": 3, "CAP_FSETID": 4,
            "CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SETPCAP": 8,
            "CAP_NET_BIND_SERVICE": 10, "CAP_SYS_CHROOT": 18, "CAP_SETFCAP": 31}


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("images")
    source = root / "probe-src"
    source.mkdir()
    for item in PROBE.iterdir():
        (source / item.name).write_bytes(item.read_bytes())
    (source / "marker.txt").write_text(MARKER)
    layout = root / "layout"
    build_image(source, "probe:v1", layout=layout)
    build_image(source, "probe:usr1", layout=layout,
                overrides=BuildOverrides(stop_signal="SIGUSR1"))
    build_image(source, "probe:app", layout=layout, overrides=BuildOverrides(user="app"))
    idle = root / "idle-src"
    idle.mkdir()
    (idle / "x.txt").write_text("x")
    build_image(idle, "idle:v1", layout=layout, overrides=BuildOverrides(  # deaf to SIGTERM
        base="builtin:busybox", entrypoint=["sh", "-c", "exec httpd -f -p $PORT"]))
    return {"probe": f"oci:{layout}:probe:v1", "usr1": f"oci:{layout}:probe:usr1",
            "idle": f"oci:{layout}:idle:v1", "as-app": f"oci:{layout}:probe:app"}


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    process = AgentProcess(tmp_path_factory.mktemp("oci") / "agent", cpus=8,
                           memory_mb=8192, extra=["--machine-pids-max", "256"]).start()
    yield process
    process.cleanup()


def offer(agent: AgentProcess, image: str, *, start: bool = True, key: str = "",
          **fields: Any) -> dict[str, Any]:
    body = {"key": key or os.urandom(6).hex(), "app": "probe", "image": image,
            "guest": GUEST, "start": start, **fields}
    status, machine = call("POST", f"{agent.url}/v1/offers", body)
    assert status == 201, machine
    return machine  # type: ignore[no-any-return]


def started(agent: AgentProcess, image: str, **fields: Any) -> dict[str, Any]:
    return agent.wait_state(offer(agent, image, **fields)["id"], "started")


def ask(machine: dict[str, Any], path: str, timeout_s: float = 10) -> Any:
    with urllib.request.urlopen(f"http://{machine['address']}{path}", timeout=timeout_s) as r:
        return json.loads(r.read())


def _answers(machine: dict[str, Any]) -> bool:
    try:
        ask(machine, "/status", timeout_s=2)
    except OSError:
        return False
    return True


def machine_call(agent: AgentProcess, mid: str, verb: str) -> dict[str, Any]:
    status, body = call("POST", f"{agent.url}/v1/machines/{mid}/{verb}")
    assert status == 200, body
    return body  # type: ignore[no-any-return]


def view(agent: AgentProcess, mid: str) -> dict[str, Any]:
    return call("GET", f"{agent.url}/v1/machines/{mid}")[1]  # type: ignore[no-any-return]


def destroy(agent: AgentProcess, mid: str) -> None:
    assert call("DELETE", f"{agent.url}/v1/machines/{mid}")[0] == 202
    wait_until(lambda: call("GET", f"{agent.url}/v1/machines/{mid}")[0] == 404, 20)


def image_rootfs(agent: AgentProcess, machine: dict[str, Any]) -> Path:
    return agent.state_dir / "images" / "rootfs" / machine["image_digest"].split(":", 1)[1]


def container_state(agent: AgentProcess, mid: str) -> dict[str, Any] | None:
    done = subprocess.run(["runc", "--root", str(agent.state_dir / "runtime"), "state", mid],
                          capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else None


def containers(agent: AgentProcess) -> list[str]:
    out = subprocess.run(["runc", "--root", str(agent.state_dir / "runtime"), "list", "-q"],
                         capture_output=True, text=True, check=True).stdout
    return sorted(out.split())


def test_an_image_with_its_own_userland_runs_as_itself_and_sees_nothing_of_the_host(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    machine = started(agent, images["probe"])
    own = image_rootfs(agent, machine)
    seen = ask(machine, "/files?path=/etc/shadow&path=/usr/lib/os-release&path=/app/marker.txt"
                        f"&path={agent.state_dir}/oplog&path=/proc/self/exe")
    assert Path("/etc/shadow").exists() and seen["/etc/shadow"] == "error: ENOENT"
    assert seen["/usr/lib/os-release"] == (own / "usr/lib/os-release").read_text()
    assert seen["/app/marker.txt"] == MARKER
    assert seen[f"{agent.state_dir}/oplog"] == "error: ENOENT"
    assert (own / "home/app").stat().st_uid == 1000  # the cache kept the image's owners
    counted = ask(machine, "/count?path=/usr/bin")["/usr/bin"]
    assert counted == len(os.listdir(own / "usr/bin")) != len(os.listdir("/usr/bin"))
    assert machine["address"].split(":")[0].startswith("10.213.")  # its own address
    destroy(agent, machine["id"])


def test_the_attackers_escapes_are_refused_from_inside(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    machine = started(agent, images["probe"])
    attacks = ask(machine, "/attack")
    assert {name: result for name, result in attacks.items() if result == "ok"} == {}
    # the namespaces and the calls the seccomp profile refuses: refused as such
    refused = [f"unshare_{ns}" for ns in ("net", "pid", "uts", "ipc", "cgroup")] + [
        "bpf", "perf_event_open", "keyctl", "add_key", "userfaultfd", "open_by_handle_at",
        "kexec_load"]
    assert {name: attacks[name] for name in refused} == dict.fromkeys(refused, "EPERM")
    status = ask(machine, "/status")
    expected = sum(1 << CAP_BITS[name] for name in DEFAULT_CAPABILITIES)
    assert int(status["CapEff"], 16) == expected  # root inside, with Podman's set only
    assert status["Seccomp"] == "2" and status["NoNewPrivs"] == "1"
    inside, outside, size = (int(x) for x in status["uid_map"].split())
    assert (inside, size) == (0, 65536) and outside >= 1 << 31  # root is nobody outside
    # writing the image's files writes the machine's own layer, never the shared cache
    written = ask(machine, "/write?path=/usr/lib/probe-was-here&data=x")
    assert written == {"write": "ok"}
    assert not (image_rootfs(agent, machine) / "usr/lib/probe-was-here").exists()
    assert (agent.state_dir / "machines" / machine["id"] / "upper/usr/lib/probe-was-here"
            ).read_text() == "x"
    destroy(agent, machine["id"])


def test_writes_to_root_survive_a_stop_and_start_vanish_on_destroy_and_are_not_shared(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    first, second = started(agent, images["probe"]), started(agent, images["probe"])
    assert ask(first, "/write?path=/app/state.txt&data=kept") == {"write": "ok"}
    assert ask(second, "/files?path=/app/state.txt")["/app/state.txt"] == "error: ENOENT"
    machine_call(agent, first["id"], "stop")
    agent.wait_state(first["id"], "stopped")
    machine_call(agent, first["id"], "start")
    again = agent.wait_state(first["id"], "started")
    assert again["pid"] != first["pid"]  # a new process, the same layer
    assert ask(again, "/files?path=/app/state.txt")["/app/state.txt"] == "kept"
    destroy(agent, first["id"])
    assert not (agent.state_dir / "machines" / first["id"]).exists()
    third = started(agent, images["probe"])
    assert ask(third, "/files?path=/app/state.txt")["/app/state.txt"] == "error: ENOENT"
    for machine in (second, third):
        destroy(agent, machine["id"])


def test_a_machine_allocating_twice_its_memory_is_oom_killed_and_others_are_not(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    bystander = started(agent, images["probe"])
    hog = started(agent, images["probe"], guest={"cpus": 0.5, "memory_mb": 64})
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        ask(hog, "/alloc?mb=128")
    wait_until(lambda: any(e["reason"] == "oom" for e in view(agent, hog["id"])["events"]), 15)
    assert ask(bystander, "/status")["pid"] == "1"  # untouched
    _, metrics = call("GET", f"{agent.url}/metrics")
    assert 'thaw_agent_machine_exits_total{reason="oom"} 1.0' in metrics
    for machine in (bystander, hog):
        destroy(agent, machine["id"])


def test_a_fork_bomb_stops_at_the_pids_limit(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    machine = started(agent, images["probe"])
    forked = ask(machine, "/fork", timeout_s=60)["forked"]
    assert 50 < forked < 256  # --machine-pids-max 256, the server's own threads included
    assert ask(machine, "/status")["pid"] == "1"  # and the machine goes on
    destroy(agent, machine["id"])


def test_a_busy_loop_with_a_quarter_cpu_gets_at_most_a_quarter_core(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    machine = started(agent, images["probe"], guest={"cpus": 0.25, "memory_mb": 128})
    cpu = controller_dir(machine["pid"], "cpuacct") or controller_dir(machine["pid"], "cpu")
    assert cpu is not None
    ask(machine, "/spin?s=6")
    time.sleep(1.0)  # the spin is under way
    used, wall = cpu_usage_s(cpu), time.monotonic()
    time.sleep(3.0)
    share = (cpu_usage_s(cpu) - used) / (time.monotonic() - wall)  # the cgroup's own count
    assert 0.1 < share <= 0.3, share
    destroy(agent, machine["id"])


def test_suspend_freezes_the_container_and_start_thaws_the_same_process(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    machine = started(agent, images["probe"])
    assert machine_call(agent, machine["id"], "suspend")["state"] == "suspended"
    assert frozen(machine["pid"])
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        ask(machine, "/status", timeout_s=0.5)
    machine_call(agent, machine["id"], "start")
    resumed = agent.wait_state(machine["id"], "started")
    assert resumed["pid"] == machine["pid"] and not frozen(machine["pid"])
    assert ask(resumed, "/status")["pid"] == "1"
    destroy(agent, machine["id"])


def test_stop_sends_the_images_stop_signal_and_sigkill_to_one_that_ignores_it(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    polite = started(agent, images["usr1"])
    # "started" is the runtime's start: the app sets its SIGUSR1 handler a moment later
    # (pid 1 ignores a signal it has no handler for), and answers once it has
    wait_until(lambda: _answers(polite), 20)
    machine_call(agent, polite["id"], "stop")
    stopped = agent.wait_state(polite["id"], "stopped")
    assert stopped["events"][-1]["reason"] == "exited(0)"
    log = call("GET", f"{agent.url}/v1/machines/{polite['id']}/logs")[1]
    assert "probe got SIGUSR1" in log
    stubborn = started(agent, images["idle"], kill_timeout_s=0.5)  # pid 1: no SIGTERM handler
    machine_call(agent, stubborn["id"], "stop")
    stopped = agent.wait_state(stubborn["id"], "stopped")
    assert stopped["events"][-1]["reason"] == "signalled(SIGKILL)"
    for machine in (polite, stubborn):
        destroy(agent, machine["id"])


def test_a_crashed_machine_is_restarted_in_a_new_container(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    machine = started(agent, images["probe"])
    os.kill(machine["pid"], 9)
    wait_until(lambda: any(e["event"] == "crash" and e["reason"] == "signalled(SIGKILL)"
                           for e in view(agent, machine["id"])["events"]), 10)
    again = agent.wait_state(machine["id"], "started")
    assert again["pid"] != machine["pid"] and ask(again, "/status")["pid"] == "1"
    destroy(agent, machine["id"])


def test_a_spare_is_a_created_container_and_its_start_is_the_runtimes_start(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    spare = offer(agent, images["probe"], start=False, spare=True)
    wait_until(lambda: (container_state(agent, spare["id"]) or {}).get("status") == "created",
               20)
    prepared = container_state(agent, spare["id"])
    assert prepared is not None
    machine_call(agent, spare["id"], "start")
    running = agent.wait_state(spare["id"], "started")
    assert running["pid"] == prepared["pid"]  # the created init exec'd the app: no new create
    assert ask(running, "/status")["pid"] == "1"
    destroy(agent, spare["id"])


def test_port_9000_with_an_app_listening_on_9000_is_served(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    machine = started(agent, images["probe"], port=9000, env={"PROBE_PORT": "9000"})
    assert machine["address"].endswith(":9000")
    assert ask(machine, "/status")["pid"] == "1"
    destroy(agent, machine["id"])


def test_an_image_with_nothing_to_run_fails_its_machine_saying_so(
    agent: AgentProcess, tmp_path: Path
) -> None:
    source = tmp_path / "empty"
    source.mkdir()
    (source / "x.txt").write_text("x")
    build_image(source, "empty:v1", layout=tmp_path / "layout")  # no entrypoint, no cmd
    machine = offer(agent, f"oci:{tmp_path / 'layout'}:empty:v1")
    failed = agent.wait_state(machine["id"], "failed")
    assert "no Entrypoint or Cmd" in failed["events"][-1]["reason"]
    destroy(agent, machine["id"])


def test_after_kill_9_of_the_agent_its_containers_are_adopted_not_duplicated(
    tmp_path: Path, images: dict[str, str]
) -> None:
    process = AgentProcess(tmp_path / "agent", cpus=4, memory_mb=4096).start()
    try:
        machines = [started(process, images["probe"]) for _ in range(2)]
        spare = offer(process, images["probe"], start=False, spare=True)
        wait_until(lambda: len(containers(process)) == 3, 20)
        process.kill9()
        assert all(pid_alive(m["pid"]) for m in machines)  # they outlive their agent
        process.start()
        for machine in machines:
            adopted = process.wait_state(machine["id"], "started")
            assert adopted["pid"] == machine["pid"]
            assert ask(adopted, "/status")["pid"] == "1"
        assert containers(process) == sorted([*(m["id"] for m in machines), spare["id"]])
    finally:
        process.cleanup()


def test_an_image_whose_user_is_not_root_runs_as_that_user_with_no_capabilities(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    machine = started(agent, images["as-app"])
    status = ask(machine, "/status")
    assert status["Uid"].split()[0] == "1000" and int(status["CapEff"], 16) == 0
    assert ask(machine, "/write?path=/etc/x&data=x")["write"] == "EACCES"
    assert ask(machine, "/write?path=/home/app/x&data=x")["write"] == "ok"  # its own home
    destroy(agent, machine["id"])


def test_a_machines_tree_is_mounted_nosuid_and_it_sees_only_its_own_cgroup_and_no_ipv6(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    machine = started(agent, images["probe"])
    rootfs = f"/run/thaw/roots/{machine['id']}/rootfs"
    mounts = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    options = next(fields[5] for fields in mounts if fields[4] == rootfs)
    assert "nosuid" in options.split(",") and "nodev" in options.split(",")
    seen = ask(machine, "/files?path=/proc/self/cgroup"
                        "&path=/proc/sys/net/ipv6/conf/all/disable_ipv6")
    assert all(line.endswith(":/") for line in seen["/proc/self/cgroup"].split())
    assert seen["/proc/sys/net/ipv6/conf/all/disable_ipv6"].strip() == "1"
    destroy(agent, machine["id"])


def test_a_machine_flooding_its_output_is_slowed_and_its_log_stays_bounded(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    machine = started(agent, images["probe"])
    log = agent.state_dir / "machines" / machine["id"] / "log"
    ask(machine, "/flood?s=4")
    biggest = 0
    for _ in range(50):  # 5 s: the flood and then some
        biggest = max(biggest, log.stat().st_size if log.exists() else 0)
        time.sleep(0.1)
    assert biggest <= (1 << 20) + (64 << 10)  # 1 MiB, cut back at once (one read past it)
    assert ask(machine, "/status")["pid"] == "1"  # slowed, not stopped
    destroy(agent, machine["id"])


def test_a_machine_with_a_very_deep_tree_is_destroyed_whole(
    agent: AgentProcess, images: dict[str, str]
) -> None:
    machine = started(agent, images["probe"])
    assert ask(machine, "/deep?n=3000", timeout_s=60) == {"deep": 3000}
    destroy(agent, machine["id"])
    assert not (agent.state_dir / "machines" / machine["id"]).exists()


def test_a_kill_9_of_the_agent_while_it_creates_containers_leaves_it_able_to_start(
    tmp_path: Path, images: dict[str, str]
) -> None:
    """The worst moment: a start and a spare's create under way (runc create, the mounts,
    the link half made). The restarted agent cleans up, starts the one, prepares the
    other."""
    process = AgentProcess(tmp_path / "agent", cpus=4, memory_mb=4096).start()
    try:
        running = offer(process, images["probe"])
        spare = offer(process, images["probe"], start=False, spare=True)
        time.sleep(0.03)  # mid-create, most of the time
        process.kill9()
        process.start()
        assert ask(process.wait_state(running["id"], "started"), "/status")["pid"] == "1"
        wait_until(lambda: (container_state(process, spare["id"]) or {}).get("status")
                   == "created", 20)
    finally:
        process.cleanup()
