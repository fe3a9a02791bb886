"""The agent as the truth about its machines, under an operator's bad day: a full disk,
a damaged op log, kill -9 in a storm of operations, an orphan process. Real agent
processes, real machine processes, a real (small) tmpfs for the full disk."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.core import oplog_codec
from agent.core.state import replay
from tests.support.agent_process import (
    AgentProcess,
    call,
    find_machine_processes,
    kill_group,
    pid_alive,
    wait_until,
)
from tests.support.disks import fill, tmpfs
from tests.support.machines import frozen, oci_driver_runs
from thaw.imagebuild import build_image

pytestmark = pytest.mark.integration
HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"
GUEST = {"cpus": 0.25, "memory_mb": 32}


@pytest.fixture(scope="module")
def hello(tmp_path_factory: pytest.TempPathFactory) -> str:
    layout = tmp_path_factory.mktemp("layout")
    build_image(HELLO, "hello:v1", layout=layout)
    return f"oci:{layout}:v1"


def offer(agent: AgentProcess, key: str, image: str = "img", start: bool = False
          ) -> tuple[int, Any]:
    return call("POST", f"{agent.url}/v1/offers",
                {"key": key, "app": "a", "image": image, "guest": GUEST, "start": start})


def agent_with_offers(state_dir: Path, count: int) -> AgentProcess:
    """An agent started in `state_dir` with `count` machines offered (not started)."""
    agent = AgentProcess(state_dir).start()
    try:
        for i in range(count):
            assert offer(agent, f"k{i}")[0] == 201
    except BaseException:
        agent.cleanup()
        raise
    return agent


def logged_state(agent: AgentProcess) -> Any:
    return replay(oplog_codec.decode((agent.state_dir / "oplog").read_bytes()).records)


# -- a full disk ------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    yield from tmpfs(tmp_path / "disk", "4m")


@pytest.fixture
def disk_with_room_for_a_pull(tmp_path: Path) -> Iterator[Path]:
    """Room above the image cache's reserve (512 MiB by default) for a pull: hello with
    its python base is ~16 MiB of blobs and ~50 MiB unpacked."""
    yield from tmpfs(tmp_path / "disk", "640m")


def test_a_full_disk_declines_offers_with_disk_full_and_recovers_without_a_restart(
    small_disk: Path,
) -> None:
    agent = agent_with_offers(small_disk / "agent", 3)
    try:
        filler = fill(small_disk)
        accepted = 3  # the log's last page may still take a few frames: offer until it cannot
        for i in range(3, 200):
            status, body = offer(agent, f"k{i}")
            if status != 201:
                break
            accepted += 1
        assert (status, body["error"]) == (503, "disk_full"), body  # JSON, not text/plain
        status, body = offer(agent, "k-again")
        assert (status, body["error"]) == (503, "disk_full"), body
        assert call("GET", f"{agent.url}/v1/status")[1]["disk_full"] is True
        # the log is whole: every accepted offer, nothing half-written
        assert len(logged_state(agent).machines) == accepted
        filler.unlink()  # space returns
        status, made = offer(agent, "k-after")
        assert status == 201, made
        assert call("GET", f"{agent.url}/v1/status")[1]["disk_full"] is False
        agent.terminate()
        agent.start()  # and it boots: no partial frame in the way
        _, machines = call("GET", f"{agent.url}/v1/machines")
        assert len(machines) == accepted + 1
    finally:
        agent.cleanup()


def exhaust_log(agent: AgentProcess) -> None:
    """Offer until the log cannot take one more frame (its last page may still have room)."""
    for i in range(500):
        status, body = offer(agent, f"filler-{i}")
        if status == 503:
            assert body["error"] == "disk_full", body
            return
        assert status == 201, body
    raise AssertionError("the log never filled")


def machine_state(agent: AgentProcess, mid: str) -> dict[str, Any]:
    status, body = call("GET", f"{agent.url}/v1/machines/{mid}")
    assert status == 200, body
    return body  # type: ignore[no-any-return]


def test_on_a_full_disk_what_happens_to_machines_is_written_once_room_returns(
    disk_with_room_for_a_pull: Path, hello: str
) -> None:
    """A machine that exits, and a stop refused for room: nothing half-done in the
    meantime (the refused stop leaves its machine running; memory and log agree), and
    once there is room the exit is written and the machine restarted, without a restart
    of the agent — or, when the log's last page took its exit but not its new process,
    failed with that reason (placement replaces a failed machine)."""
    disk = disk_with_room_for_a_pull
    agent = AgentProcess(disk / "agent", extra=["--allow-layout", hello[4:-3]]).start()
    try:
        ids = []
        for i in range(3):
            status, made = offer(agent, f"run-{i}", hello, start=True)  # one write each
            assert status == 201, made
            ids.append(agent.wait_state(made["id"], "started")["id"])
        crashing, *others = (machine_state(agent, mid) for mid in ids)
        filler = fill(disk)
        exhaust_log(agent)  # the log is known full: stops are refused before a write
        kill_group(crashing["pid"])  # exits unasked while (almost) nothing can be written
        for machine in others:
            status, body = call("POST", f"{agent.url}/v1/machines/{machine['id']}/stop")
            assert (status, body["error"]) == (503, "disk_full"), body
        time.sleep(1.0)  # the watch has seen the exit and could not write all of it
        for machine in others:
            assert machine_state(agent, machine["id"])["state"] == "started"
            assert pid_alive(machine["pid"])  # a refused stop stops nothing
        logged = logged_state(agent).machines
        seen = machine_state(agent, crashing["id"])
        assert logged[crashing["id"]].state.value == seen["state"]  # memory and log agree
        filler.unlink()

        def settled() -> bool:
            now = machine_state(agent, crashing["id"])
            return now["state"] == "failed" or (
                now["state"] == "started" and now["pid"] not in (0, crashing["pid"]))

        wait_until(settled, 20)
        after = machine_state(agent, crashing["id"])
        events = [e["event"] for e in after["events"]]
        if after["state"] == "started":
            assert events[-2:] == ["crash", "ready"], events
        else:
            assert "could not be recorded" in after["events"][-1]["reason"], after["events"]
        for machine in others:
            status, body = call("POST", f"{agent.url}/v1/machines/{machine['id']}/stop")
            assert status == 200, body
            agent.wait_state(machine["id"], "stopped")
        assert not any(pid_alive(m["pid"]) for m in others)
    finally:
        agent.cleanup()


def test_on_a_full_disk_starts_and_stops_get_disk_full_and_a_stop_taken_ends_with_room(
    disk_with_room_for_a_pull: Path, hello: str
) -> None:
    """A stop taken as the disk fills (its record fits the log's last page) waits,
    `stopping`, for room to write the exit; once the log is known full, a start of it
    (or of any machine) and a stop are 503 disk_full, not 409 illegal_transition, and
    stop nothing; with room again the stop ends and the machine starts."""
    disk = disk_with_room_for_a_pull
    agent = AgentProcess(disk / "agent", extra=["--allow-layout", hello[4:-3]]).start()
    try:
        ids = []
        for i in range(2):
            status, made = offer(agent, f"run-{i}", hello, start=True)
            assert status == 201, made
            ids.append(agent.wait_state(made["id"], "started")["id"])
        first, second = (machine_state(agent, mid) for mid in ids)
        filler = fill(disk)
        status, body = call("POST", f"{agent.url}/v1/machines/{first['id']}/stop")
        assert status == 200 or (status, body["error"]) == (503, "disk_full"), body
        exhaust_log(agent)  # now the log is known full
        for mid in ids:
            status, body = call("POST", f"{agent.url}/v1/machines/{mid}/start")
            assert (status, body["error"]) == (503, "disk_full"), body
        status, body = call("POST", f"{agent.url}/v1/machines/{second['id']}/stop")
        assert (status, body["error"]) == (503, "disk_full"), body
        assert machine_state(agent, second["id"])["state"] == "started"
        assert pid_alive(second["pid"])  # a refused stop stops nothing
        filler.unlink()
        wait_until(lambda: machine_state(agent, first["id"])["state"] in ("stopped",
                                                                         "started"), 20)
        if machine_state(agent, first["id"])["state"] == "started":  # its stop was refused
            assert call("POST", f"{agent.url}/v1/machines/{first['id']}/stop")[0] == 200
            agent.wait_state(first["id"], "stopped")
        status, body = call("POST", f"{agent.url}/v1/machines/{first['id']}/start")
        assert status == 200, body
        agent.wait_state(first["id"], "started")
    finally:
        agent.cleanup()


def test_a_repair_without_room_for_its_copy_says_so_and_changes_nothing(
    small_disk: Path,
) -> None:
    agent = agent_with_offers(small_disk / "agent", 3)
    try:
        agent.terminate()
        log = agent.state_dir / "oplog"
        data = bytearray(log.read_bytes())
        data[len(oplog_codec.MAGIC) + 20] ^= 0x01  # inside the first frame
        log.write_bytes(bytes(data) + bytes(64 << 10))  # grown: the copy cannot fit
        filler = fill(small_disk)
        agent.args.append("--repair")
        with pytest.raises(RuntimeError):
            agent.start()
        assert "cannot keep a copy of the op log" in agent.log_path.read_text()
        assert log.read_bytes() == bytes(data) + bytes(64 << 10)  # untouched
        assert not list(agent.state_dir.glob("oplog.*-*"))  # no partial copy left
        filler.unlink()
        agent.start()  # with room, the repair goes through
        assert list(agent.state_dir.glob("oplog.damaged-*"))
    finally:
        agent.cleanup()


# -- a damaged log --------------------------------------------------------------------------


def test_a_damaged_log_stops_the_agent_and_repair_keeps_the_prefix_and_kills_the_rest(
    tmp_path: Path, hello: str
) -> None:
    agent = AgentProcess(tmp_path / "agent").start()
    try:
        ids = []
        for i in range(3):
            status, machine = offer(agent, f"k{i}", hello, start=True)
            assert status == 201, machine
            ids.append(agent.wait_state(machine["id"], "started")["id"])
        pids = {m["id"]: m["pid"] for m in call("GET", f"{agent.url}/v1/machines")[1]}
        agent.terminate()  # the machines outlive the agent
        data = bytearray((agent.state_dir / "oplog").read_bytes())
        records = oplog_codec.decode(bytes(data)).records
        keep = next(i for i, r in enumerate(records)
                    if getattr(r, "id", None) == ids[1] and type(r).__name__ == "Created")
        offset = len(oplog_codec.MAGIC) + sum(len(oplog_codec.encode(r))
                                              for r in records[:keep])
        data[offset + 25] ^= 0x04  # one bit, mid-log
        (agent.state_dir / "oplog").write_bytes(bytes(data))

        with pytest.raises(RuntimeError):
            agent.start()
        said = agent.log_path.read_text()
        assert f"damaged at byte {offset}" in said and "--repair" in said
        assert all(pid_alive(pid) for pid in pids.values())  # nothing touched yet

        agent.args.append("--repair")
        agent.start()
        assert list(agent.state_dir.glob("oplog.damaged-*"))
        _, machines = call("GET", f"{agent.url}/v1/machines")
        assert [m["id"] for m in machines] == ids[:1]  # the prefix: the first machine
        wait_until(lambda: not any(pid_alive(pids[m]) for m in ids[1:]), 10)
        assert pid_alive(pids[ids[0]])  # re-adopted, not killed
        assert find_machine_processes(set(ids[1:])) == []
    finally:
        agent.cleanup()
        for pid in find_machine_processes(set(ids)):
            kill_group(pid)


def suspended_hello(agent: AgentProcess, hello: str) -> tuple[dict[str, Any], str]:
    """A machine of `hello` started, then suspended (frozen): its view and its URL."""
    status, made = offer(agent, "k", hello, start=True)
    assert status == 201, made
    machine = agent.wait_state(made["id"], "started")
    url = f"{agent.url}/v1/machines/{machine['id']}"
    assert call("POST", f"{url}/suspend")[0] == 200 and frozen(machine["pid"])
    return machine, url


def test_an_agent_killed_as_it_resumes_a_machine_recovers_it_as_its_log_says(
    tmp_path: Path, hello: str
) -> None:
    """A resume does not wait for the op log's fsync before it thaws the machine (nothing
    new runs). Killed -9 just after the start was taken (answered: its record on disk),
    before or after the thaw and the Started record, the agent finds the same process at
    recovery and finishes the start: started, thawed, answering."""
    agent = AgentProcess(tmp_path / "agent", cpus=2, memory_mb=1024).start()
    try:
        machine, url = suspended_hello(agent, hello)
        assert call("POST", f"{url}/start")[0] == 200  # taken (written, not yet on disk)
        agent.kill9()
        agent.start()

        after = agent.wait_state(machine["id"], "started")
        assert after["pid"] == machine["pid"]  # re-adopted and thawed, not run again
        assert not frozen(machine["pid"])
        assert call("GET", f"http://{after['address']}/")[0] == 200
    finally:
        agent.cleanup()


def test_an_agent_killed_as_soon_as_it_answered_a_resume_started_recovers_it_started(
    tmp_path: Path, hello: str
) -> None:
    """`start?wait_s` answers a resume (`started`) before its records are fsynced: they are
    written to the log before the answer, so an agent killed -9 right after it (not the
    host: a host that loses its page cache loses the machine's process too) finds them at
    recovery — the machine started, the same process, thawed, answering."""
    agent = AgentProcess(tmp_path / "agent", cpus=2, memory_mb=1024).start()
    try:
        machine, url = suspended_hello(agent, hello)
        status, answered = call("POST", f"{url}/start?wait_s=10")
        assert status == 200 and answered["state"] == "started", answered
        assert answered["events"][-1]["reason"] == "resumed"
        agent.kill9()
        agent.start()

        after = agent.wait_state(machine["id"], "started")
        assert after["pid"] == machine["pid"] and not frozen(machine["pid"])
        assert [(e["event"], e["reason"]) for e in after["events"][-2:]] == [
            ("start", ""), ("ready", "resumed")]
        assert call("GET", f"http://{after['address']}/")[0] == 200
    finally:
        agent.cleanup()


@pytest.fixture(scope="module")
def slow_hello(tmp_path_factory: pytest.TempPathFactory) -> str:
    """examples/hello, listening only 4 s after it starts."""
    src = tmp_path_factory.mktemp("slow-src")
    shutil.copytree(HELLO, src, dirs_exist_ok=True)
    app = src / "app.py"
    listen = '    port = int(os.environ.get("PORT", "8080"))'
    text = app.read_text()
    assert listen in text
    app.write_text(text.replace(listen, f"    __import__('time').sleep(4)\n{listen}"))
    layout = tmp_path_factory.mktemp("slow-layout")
    build_image(src, "slow:v1", layout=layout)
    return f"oci:{layout}:v1"


def test_an_agent_killed_while_a_launched_machine_is_not_yet_listening_probes_it_again(
    tmp_path: Path, slow_hello: str
) -> None:
    """Recovery finds the machine starting with a live process that was never ready: it
    is probed until it listens, not taken for a thawed one (started at once)."""
    agent = AgentProcess(tmp_path / "agent", cpus=2, memory_mb=1024).start()
    try:
        status, made = offer(agent, "k", slow_hello, start=True)
        assert status == 201, made
        url = f"{agent.url}/v1/machines/{made['id']}"
        wait_until(lambda: bool(call("GET", url)[1].get("pid")), 20)  # launched, probing
        agent.kill9()
        agent.start()
        after = agent.wait_state(made["id"], "started")
        assert call("GET", f"http://{after['address']}/")[0] == 200  # listening once started
    finally:
        agent.cleanup()


# -- kill -9 in a storm, and an orphan --------------------------------------------------------


async def storm(agent: AgentProcess, image: str, machines: int, name: str) -> dict[str, str]:
    """Offers (half started), then starts, stops and destroys, all at once; returns what
    each acknowledged machine was last acknowledged as (created/started/stopped/destroyed)."""
    acked: dict[str, str] = {}

    async def one(i: int) -> None:
        status, made = await asyncio.to_thread(offer, agent, f"{name}-{i}", image, i % 2 == 0)
        if status not in (200, 201):
            return
        mid = made["id"]
        acked[mid] = "started" if i % 2 == 0 else "created"
        for action, state in (("stop", "stopped"), ("start", "started"),
                              ("destroy", "destroyed")):
            if i % 3 == ("stop", "start", "destroy").index(action):
                method = "DELETE" if action == "destroy" else "POST"
                path = f"/v1/machines/{mid}" + ("" if action == "destroy" else f"/{action}")
                if action == "destroy":
                    # sent: durable or not, whether or not its answer arrives before the kill
                    acked[mid] = "destroy sent"
                status, _ = await asyncio.to_thread(call, method, agent.url + path)
                if status in (200, 202):
                    acked[mid] = state

    await asyncio.gather(*(one(i) for i in range(machines)), return_exceptions=True)
    return acked


@pytest.mark.slow
def test_after_kill_9_in_a_storm_no_machine_is_lost_orphaned_or_run_twice(
    tmp_path: Path, hello: str
) -> None:
    agent = AgentProcess(tmp_path / "agent", cpus=64, memory_mb=65536).start()
    planted: subprocess.Popen[bytes] | None = None
    try:
        acked = asyncio.run(storm(agent, hello, 20, "calm"))  # machines that run
        # the planted container's rootfs: the image's, linked now (its pull may not be
        # done yet, and the cache may evict it once the destroys leave no machine on it)
        keep = tmp_path / "planted-rootfs"
        if oci_driver_runs():  # (the image is pulled after the offers are answered)
            unpacked = agent.state_dir / "images" / "rootfs"
            wait_until(lambda: any(m["state"] == "started"  # its rootfs is whole
                                   for m in call("GET", f"{agent.url}/v1/machines")[1]), 30)
            shutil.copytree(next(unpacked.iterdir()), keep, symlinks=True,
                            copy_function=os.link)
        task = threading_storm(agent, hello)
        time.sleep(1.0)  # mid-storm
        agent.kill9()
        acked.update(task())
        # an orphan of this agent's the log has never heard of
        orphan_dir = agent.state_dir / "machines" / "planted"
        orphan_dir.mkdir(parents=True)
        if oci_driver_runs():
            plant_container(agent.state_dir, "planted", keep)
        else:
            planted = subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                env={**os.environ, "THAW_MACHINE_ID": "planted",
                     "THAW_MACHINE_DIR": str(orphan_dir)})
        agent.start()
        if planted is not None:
            wait_until(lambda: planted.poll() is not None, 10)  # killed at start
        else:
            wait_until(lambda: "planted" not in containers(agent.state_dir), 10)
        state = logged_state(agent)
        for mid, last in acked.items():
            if last in ("destroyed", "destroy sent"):
                continue
            assert mid in state.machines, f"acknowledged machine {mid} ({last}) was lost"
        everyone = set(state.machines) | set(acked) | {"planted"}

        def settled() -> bool:
            sessions = machine_sessions(everyone)
            recorded = {m.process.pid for m in logged_state(agent).machines.values()
                        if m.process is not None}
            return (all(len(pids) == 1 for pids in sessions.values())  # one group per id
                    and {p for pids in sessions.values() for p in pids} <= recorded)

        wait_until(settled, 20)  # and no machine process the log does not record
    finally:
        if planted is not None and planted.poll() is None:
            planted.kill()
        agent.cleanup()


def containers(state_dir: Path) -> list[str]:
    """Names of the containers in the agent's runtime root: its directories that hold a
    state (what `runc list` reads; runc 1.1's list fails outright when a container is
    deleted while it reads, as the agent's start does to the planted one)."""
    root = state_dir / "runtime"
    if not root.exists():
        return []
    return sorted(entry.name for entry in root.iterdir() if (entry / "state.json").exists())


def plant_container(state_dir: Path, name: str, rootfs: Path) -> None:
    """A container in the agent's runtime root that its op log has never heard of: an
    image's rootfs, read-only, sleeping."""
    bundle = state_dir.parent / f"bundle-{name}"
    bundle.mkdir()
    subprocess.run(["runc", "spec"], cwd=bundle, check=True)
    config = json.loads((bundle / "config.json").read_text())
    config["root"] = {"path": str(rootfs), "readonly": True}
    config["process"].update(terminal=False, args=["python3", "-c",
                                                   "import time; time.sleep(300)"])
    (bundle / "config.json").write_text(json.dumps(config))
    subprocess.run(["runc", "--root", str(state_dir / "runtime"), "run", "-d", "--bundle",
                    str(bundle), name], check=True, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def threading_storm(agent: AgentProcess, image: str) -> Any:
    """Run `storm` of 40 more machines in a thread; the returned callable joins it."""
    import threading

    result: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: result.update(acked=asyncio.run(storm(agent, image, 40, "storm"))),
        daemon=True)
    thread.start()

    def join() -> dict[str, str]:
        thread.join(timeout=60)
        acked: dict[str, str] = result.get("acked", {})
        return acked

    return join


def machine_sessions(ids: set[str]) -> dict[str, list[int]]:
    """Machine id -> pids of the live session leaders carrying it (a sandboxed machine is
    a wrapper leading its session plus the app: one session)."""
    sessions: dict[str, list[int]] = {}
    for pid in find_machine_processes(ids):
        try:
            if os.getsid(pid) != pid or not pid_alive(pid):
                continue
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (ProcessLookupError, OSError):
            continue
        mid = next((e[16:].decode() for e in environ if e.startswith(b"THAW_MACHINE_ID=")), "")
        sessions.setdefault(mid, []).append(pid)
    return sessions


FORKING_APP = '''\
import http.server, os, subprocess, sys, time
SLEEP = [sys.executable, "-c", "import time; time.sleep(300)"]
# Three ways out of the machine's process group: a session of its own, a group of its
# own, and a daemon (fork, setsid, fork: not even a session leader).
subprocess.Popen(SLEEP, start_new_session=True)
subprocess.Popen(SLEEP, process_group=0)
middle = os.fork()
if middle == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, SLEEP)
    os._exit(0)
os.waitpid(middle, 0)
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
http.server.HTTPServer(("0.0.0.0", int(os.environ["PORT"])), Ok).serve_forever()
'''


def live_processes(mid: str) -> list[int]:
    return [pid for pid in find_machine_processes({mid}) if pid_alive(pid)]


def test_processes_that_left_their_machines_group_die_with_it_without_a_sandbox(
    tmp_path: Path,
) -> None:
    """On a stop, and on a stop that comes while a crashed machine waits to restart."""
    source = tmp_path / "forking"
    source.mkdir()
    (source / "app.py").write_text(FORKING_APP)
    (source / "thaw-image.toml").write_text(
        'from = "builtin:python3"\nentrypoint = ["python3", "app.py"]\n')
    build_image(source, "forking:v1", layout=tmp_path / "layout")
    agent = AgentProcess(tmp_path / "agent", extra=["--driver", "process"]).start()
    mid = ""
    try:
        status, made = offer(agent, "f", f"oci:{tmp_path / 'layout'}:v1", start=True)
        assert status == 201, made
        mid = made["id"]
        started = agent.wait_state(mid, "started")
        wait_until(lambda: len(live_processes(mid)) == 4, 10)  # the app and three strays
        assert call("POST", f"{agent.url}/v1/machines/{mid}/stop")[0] == 200
        agent.wait_state(mid, "stopped")
        wait_until(lambda: live_processes(mid) == [], 10)

        assert call("POST", f"{agent.url}/v1/machines/{mid}/start")[0] == 200
        started = agent.wait_state(mid, "started")
        wait_until(lambda: len(live_processes(mid)) == 4, 10)
        kill_group(started["pid"])  # a crash: the strays live on
        wait_until(lambda: machine_state(agent, mid)["events"][-1]["event"] == "crash", 10)
        assert call("POST", f"{agent.url}/v1/machines/{mid}/stop")[0] == 200  # in the backoff
        agent.wait_state(mid, "stopped")
        wait_until(lambda: live_processes(mid) == [], 10)
    finally:
        agent.cleanup()
        for pid in find_machine_processes({mid}) if mid else []:
            kill_group(pid)
