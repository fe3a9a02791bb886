"""The process driver against real machine processes, with and without bubblewrap.

Every machine a test launches carries a per-test token in its environment;
teardown fails the test if any process with that token, or any process seen
in a machine's group, is still in /proc (zombies included).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent import procfs
from agent.driver import ProcessDriver, ProcessIdentity, allocate_port
from agent.driver import ProcessLaunch as LaunchSpec
from agent.machinelog import read_log, trim_log
from agent.ready import ReadyResult
from tests.support.loopturns import LoopTurns
from tests.support.machines import app_rootfs
from tests.support.ports import wait_for_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
HOST_PYTHON = "/usr/bin/python3"
TOKEN_ENV = "THAW_TEST_TOKEN"

APP = r"""
import http.server, os, signal, sys, time

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("hello from " + os.environ["THAW_MACHINE_ID"]).encode()
        self.send_response(200 if self.path in ("/", "/healthz") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

def bye(signum, frame):
    print("bye", flush=True)
    os._exit(0)

mode = os.environ.get("APP_MODE", "serve")
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "stubborn" else bye)
print("booting", mode, flush=True)
if mode == "exit":
    sys.exit(3)
if mode == "silent":
    time.sleep(60)
if mode == "chatty":
    for n in range(100000):
        os.write(1, f"line {n:06d} {'x' * 200}\n".encode())  # one write per line
        time.sleep(0.002)
server = http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler)
server.serve_forever()
"""

# Stands in for an agent killed with -9: a subreaper (like the host's init)
# runs a launcher that starts a machine, prints its identity and is killed.
SUPERVISOR = """
import ctypes, os, signal, subprocess, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come here
launcher = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                            stdout=subprocess.PIPE)
line = launcher.stdout.readline()
os.kill(launcher.pid, signal.SIGKILL)
launcher.wait()
sys.stdout.buffer.write(line)
sys.stdout.flush()
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
"""

LAUNCHER = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from agent.driver import ProcessLaunch as LaunchSpec, ProcessDriver
args = json.loads(sys.argv[1])
driver = ProcessDriver(sandbox=args.pop("sandbox"))
spec = LaunchSpec(rootfs=Path(args.pop("rootfs")), log_path=Path(args.pop("log_path")), **args)
ident = driver.launch(spec)
print(json.dumps({{"pid": ident.pid, "start_time": ident.start_time}}), flush=True)
time.sleep(60)
"""


@dataclass
class Machines:
    """Launches test machines and remembers every process it saw."""

    driver: ProcessDriver
    root: Path
    rootfs: Path  # an image's tree: its own python and /srv/app.py
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    launched: list[ProcessIdentity] = field(default_factory=list)
    seen: set[tuple[int, int]] = field(default_factory=set)

    def spec(self, mode: str = "serve", *, machine_id: str | None = None) -> LaunchSpec:
        machine_id = machine_id or f"m-{uuid.uuid4().hex[:8]}"
        (self.root / machine_id).mkdir(parents=True)
        rootfs = self.rootfs
        env = {
            "PORT": str(allocate_port()),
            "APP_MODE": mode,
            "PYTHONUNBUFFERED": "1",
            TOKEN_ENV: self.token,
        }
        argv = [HOST_PYTHON if mode == "serve" else "python3", "app.py"]
        log_path = self.root / machine_id / "machine.log"
        return LaunchSpec(machine_id, argv, env, rootfs, "/srv", log_path)

    def launch(self, spec: LaunchSpec) -> ProcessIdentity:
        ident = self.driver.launch(spec)
        self.launched.append(ident)
        self.remember(ident)
        return ident

    def remember(self, ident: ProcessIdentity) -> None:
        for member in procfs.group_members(ident.pid):
            self.seen.add((member.pid, member.start_time))

    async def start(self, mode: str = "serve") -> tuple[ProcessIdentity, LaunchSpec]:
        spec = self.spec(mode)
        ident = self.launch(spec)
        result = await self.driver.wait_ready(ident, "127.0.0.1", port(spec), None, 10)
        assert result == ReadyResult(True, ""), read_log(spec.log_path, 2000)
        self.remember(ident)
        return ident, spec

    def leftovers(self) -> list[int]:
        """Processes of this test still in /proc: by token, or seen in a group."""
        tagged = {
            stat.pid
            for stat in procfs.stats()
            if procfs.environ_value(stat.pid, TOKEN_ENV) == self.token
        }
        seen = {
            pid
            for pid, start in self.seen
            if (stat := procfs.read_stat(pid)) and stat.start_time == start
        }
        return sorted(tagged | seen)


@pytest.fixture(params=[False, True], ids=["plain", "bwrap"])
def sandbox(request: pytest.FixtureRequest) -> bool:
    if request.param and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    return bool(request.param)


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An image's tree with its own python (a sandbox runs it as `/`) and /srv/app.py."""
    return app_rootfs(tmp_path_factory.mktemp("image"), "driver-app", {"app.py": APP})


@pytest.fixture
async def machines(sandbox: bool, tmp_path: Path, rootfs: Path) -> AsyncIterator[Machines]:
    fleet = Machines(ProcessDriver(sandbox=sandbox), tmp_path, rootfs)
    yield fleet
    left = fleet.leftovers()
    for ident in fleet.launched:
        await fleet.driver.stop(ident, signal.SIGKILL, 0)
    assert left == [], f"the test left processes behind: {[procfs.read_stat(p) for p in left]}"
    assert fleet.leftovers() == []


def launch_and_kill_launcher(
    args: dict[str, object],
) -> tuple[subprocess.Popen[bytes], ProcessIdentity]:
    """Start SUPERVISOR; returns it (still reaping) and the identity its launcher printed."""
    launcher = LAUNCHER.format(repo=str(REPO))
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, launcher, json.dumps(args)], stdout=subprocess.PIPE
    )
    assert supervisor.stdout is not None
    return supervisor, ProcessIdentity(**json.loads(supervisor.stdout.readline()))


async def until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def port(spec: LaunchSpec) -> int:
    return int(spec.env["PORT"])


def http_get(spec: LaunchSpec, path: str = "/", timeout_s: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port(spec)), timeout=timeout_s) as sock:
        return send_get(sock, path)


def send_get(sock: socket.socket, path: str = "/") -> bytes:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n".encode())
    return read_to_end(sock)


def read_to_end(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks)


async def test_launched_http_app_becomes_ready_and_answers(machines: Machines) -> None:
    ident, spec = await machines.start()

    assert machines.driver.alive(ident)
    answer = await asyncio.to_thread(http_get, spec)
    assert answer.startswith(b"HTTP/1.0 200")
    assert answer.endswith(f"hello from {spec.machine_id}".encode())
    await machines.driver.stop(ident, signal.SIGTERM, 5)


async def test_a_launch_off_the_loop_becomes_ready_while_the_loop_runs(
    machines: Machines,
) -> None:
    spec = machines.spec()
    async with LoopTurns() as turns:
        ident = await machines.driver.launch_off_loop(spec)
    machines.launched.append(ident)
    machines.remember(ident)
    result = await machines.driver.wait_ready(ident, "127.0.0.1", port(spec), None, 10)

    assert result == ReadyResult(True, ""), read_log(spec.log_path, 2000)
    assert turns.count > 0  # the loop went on while the process was forked and exec'd
    assert (await asyncio.to_thread(http_get, spec)).startswith(b"HTTP/1.0 200")
    await machines.driver.stop(ident, signal.SIGTERM, 5)


async def test_a_launch_off_the_loop_cancelled_kills_the_process_it_made(
    machines: Machines,
) -> None:
    spec = machines.spec()
    launching = asyncio.create_task(machines.driver.launch_off_loop(spec))
    await asyncio.sleep(0)  # the fork is under way in its thread
    launching.cancel()
    with pytest.raises(asyncio.CancelledError):
        await launching
    await until(lambda: spec.log_path.exists())
    await until(lambda: machines.leftovers() == [])

    exits = machines.launch(machines.spec("exit"))  # a launch reaps what was killed
    await until(lambda: not machines.driver.alive(exits))


async def test_wait_ready_on_a_health_path_needs_a_2xx(machines: Machines) -> None:
    ident, spec = await machines.start()

    healthy = await machines.driver.wait_ready(ident, "127.0.0.1", port(spec), "/healthz", 5)
    missing = await machines.driver.wait_ready(ident, "127.0.0.1", port(spec), "/nope", 0.3)

    assert healthy == ReadyResult(True, "")
    assert missing == ReadyResult(False, "timeout")
    await machines.driver.stop(ident, signal.SIGTERM, 5)


async def test_sigterm_stop_runs_the_apps_handler_and_leaves_no_process(machines: Machines) -> None:
    ident, spec = await machines.start()
    pids = machines.driver.group_pids(ident)

    await machines.driver.stop(ident, signal.SIGTERM, 5)

    assert b"bye" in read_log(spec.log_path, 4096)
    assert machines.driver.group_pids(ident) == []
    assert not machines.driver.alive(ident)
    assert [pid for pid in pids if procfs.read_stat(pid) is not None] == []


async def test_stop_escalates_to_sigkill_for_an_app_that_ignores_sigterm(
    machines: Machines,
) -> None:
    ident, spec = await machines.start("stubborn")
    started = time.monotonic()

    await machines.driver.stop(ident, signal.SIGTERM, 0.5)

    took_s = time.monotonic() - started
    assert 0.5 <= took_s < 5.5
    assert machines.driver.group_pids(ident) == []
    assert b"bye" not in read_log(spec.log_path, 4096)


async def test_suspended_machine_does_not_answer_until_resumed(machines: Machines) -> None:
    ident, spec = await machines.start()

    assert machines.driver.suspend(ident)
    with socket.create_connection(("127.0.0.1", port(spec)), timeout=5) as sock:
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            send_get(sock)  # the kernel accepts the connection; the frozen app never reads it
        sock.settimeout(5)
        assert machines.driver.resume(ident)
        answer = await asyncio.to_thread(read_to_end, sock)
    assert answer.startswith(b"HTTP/1.0 200")
    assert machines.driver.alive(ident)
    await machines.driver.stop(ident, signal.SIGTERM, 5)


async def test_stopping_a_suspended_machine_continues_it_so_its_handler_runs(
    machines: Machines,
) -> None:
    ident, spec = await machines.start()
    assert machines.driver.suspend(ident)

    await machines.driver.stop(ident, signal.SIGTERM, 5)

    assert b"bye" in read_log(spec.log_path, 4096)
    assert machines.driver.group_pids(ident) == []


async def test_alive_is_false_once_the_process_has_exited(machines: Machines) -> None:
    spec = machines.spec("exit")
    ident = machines.launch(spec)
    await until(lambda: not machines.driver.alive(ident))

    assert not machines.driver.alive(ident)
    assert not machines.driver.signal(ident, signal.SIGTERM)
    assert machines.driver.group_pids(ident) == []


async def test_alive_rejects_a_live_pid_with_another_start_time(machines: Machines) -> None:
    ident, _ = await machines.start()
    impostor = ProcessIdentity(ident.pid, ident.start_time + 1)

    assert machines.driver.alive(ident)
    assert not machines.driver.alive(impostor)
    assert not machines.driver.signal(impostor, signal.SIGTERM)
    assert machines.driver.group_pids(impostor) == []
    assert machines.driver.alive(ident)
    await machines.driver.stop(ident, signal.SIGTERM, 5)


async def test_wait_ready_reports_exited_promptly_for_an_app_that_exits_at_once(
    machines: Machines,
) -> None:
    spec = machines.spec("exit")
    ident = machines.launch(spec)
    started = time.monotonic()

    result = await machines.driver.wait_ready(ident, "127.0.0.1", port(spec), None, 30)

    assert result == ReadyResult(False, "exited")
    assert time.monotonic() - started < 10  # far before its 30 s timeout
    assert b"booting exit" in read_log(spec.log_path, 4096)
    await machines.driver.stop(ident, signal.SIGTERM, 1)


async def test_wait_ready_times_out_for_an_app_that_never_listens(machines: Machines) -> None:
    spec = machines.spec("silent")
    ident = machines.launch(spec)

    result = await machines.driver.wait_ready(ident, "127.0.0.1", port(spec), None, 0.5)

    assert result == ReadyResult(False, "timeout")
    assert machines.driver.alive(ident)
    await machines.driver.stop(ident, signal.SIGTERM, 5)


async def test_machine_outlives_a_killed_launcher_and_a_fresh_driver_adopts_it(
    machines: Machines,
) -> None:
    spec = machines.spec()
    args = {
        "machine_id": spec.machine_id,
        "argv": spec.argv,
        "env": spec.env,
        "rootfs": str(spec.rootfs),
        "workdir": spec.workdir,
        "log_path": str(spec.log_path),
        "sandbox": machines.driver.sandboxed,
    }
    supervisor, ident = await asyncio.to_thread(launch_and_kill_launcher, args)
    machines.remember(ident)
    await asyncio.to_thread(wait_for_port, "127.0.0.1", port(spec))

    fresh = ProcessDriver(sandbox=machines.driver.sandboxed)
    leader = procfs.read_stat(ident.pid)
    assert leader is not None and leader.ppid == supervisor.pid  # not our child
    assert fresh.alive(ident)
    assert (await asyncio.to_thread(http_get, spec)).startswith(b"HTTP/1.0 200")
    await fresh.stop(ident, signal.SIGTERM, 5)

    assert b"bye" in read_log(spec.log_path, 4096)
    assert not fresh.alive(ident)
    assert await asyncio.to_thread(supervisor.wait, 10) == 0  # reaped everything


async def test_own_sessions_are_the_machines_launched_for_a_dir_under_the_agents(
    machines: Machines, tmp_path: Path
) -> None:
    first, spec = await machines.start()
    second, other = await machines.start()

    found = machines.driver.own_sessions(machines.root)
    assert sorted(found) == sorted([(spec.machine_id, first), (other.machine_id, second)])
    assert machines.driver.own_sessions(tmp_path / "another-agent") == []
    for ident in (first, second):
        await machines.driver.stop(ident, signal.SIGTERM, 5)


async def test_trim_log_keeps_the_tail_and_the_app_keeps_appending(machines: Machines) -> None:
    spec = machines.spec("chatty")
    ident = machines.launch(spec)
    await until(lambda: spec.log_path.stat().st_size >= 20_000)
    assert machines.driver.suspend(ident)  # hold the writer still to compare exactly
    tail = read_log(spec.log_path, 4_000)

    assert trim_log(spec.log_path, max_bytes=10_000, keep_bytes=4_000)
    assert spec.log_path.read_bytes() == tail
    assert not trim_log(spec.log_path, max_bytes=10_000, keep_bytes=4_000)

    assert machines.driver.resume(ident)
    await until(lambda: spec.log_path.stat().st_size >= 8_000)
    grown = spec.log_path.read_bytes()
    assert grown.startswith(tail)
    assert b"\0" not in grown  # writes landed at the new end, not the old offset
    last = tail.rstrip(b"\n").rsplit(b"\n", 1)[-1].split()[1]
    assert grown[len(tail) :].startswith(b"line %06d" % (int(last) + 1))
    await machines.driver.stop(ident, signal.SIGTERM, 5)


def test_read_log_of_a_missing_log_is_empty(tmp_path: Path) -> None:
    assert read_log(tmp_path / "none.log", 100) == b""
    assert not trim_log(tmp_path / "none.log", 10, 5)


def test_allocated_port_can_be_bound() -> None:
    chosen = allocate_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", chosen))


def test_default_driver_sandboxes_when_bubblewrap_works() -> None:
    assert ProcessDriver().sandboxed == (shutil.which("bwrap") is not None)
