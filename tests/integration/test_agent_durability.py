"""The agent as the truth about its machines, under an operator's bad day: a full disk,
a damaged op log, kill -9 in a storm of operations, an orphan process. Real agent
processes, real machine processes, a real (small) tmpfs for the full disk."""

from __future__ import annotations

import asyncio
import errno
import os
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


def logged_state(agent: AgentProcess) -> Any:
    return replay(oplog_codec.decode((agent.state_dir / "oplog").read_bytes()).records)


# -- a full disk ------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (tests/unit/test_oplog_file.py stands in a "
                    "full disk for the same rules)")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path) -> Path:
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def test_a_full_disk_declines_offers_with_disk_full_and_recovers_without_a_restart(
    small_disk: Path,
) -> None:
    agent = AgentProcess(small_disk / "agent").start()
    try:
        for i in range(3):
            assert offer(agent, f"k{i}")[0] == 201
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
        task = threading_storm(agent, hello)
        time.sleep(1.0)  # mid-storm
        agent.kill9()
        acked.update(task())
        # an orphan of this agent's the log has never heard of
        orphan_dir = agent.state_dir / "machines" / "planted"
        orphan_dir.mkdir(parents=True)
        planted = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
            env={**os.environ, "THAW_MACHINE_ID": "planted",
                 "THAW_MACHINE_DIR": str(orphan_dir)})
        agent.start()
        wait_until(lambda: planted.poll() is not None, 10)  # killed at start
        state = logged_state(agent)
        for mid, last in acked.items():
            if last == "destroyed":
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
