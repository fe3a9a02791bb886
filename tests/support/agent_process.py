"""A `thaw agent` run as a real subprocess, and cleanup of every machine it started."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agent.core.oplog_codec import decode
from agent.core.state import replay
from agent.procfs import read_stat
from tests.support.credentials import ENV, bearer, signed_headers
from tests.support.machines import TEST_DRIVER, sweep
from tests.support.ports import free_port, wait_for_port, wait_until_unbound


def call(
    method: str, url: str, body: Any = None, timeout_s: float = 30.0, *, token: str = "",
    signed: bool = True,
) -> tuple[int, Any]:
    """One HTTP request, signed with the test cluster key (internal routes need it, public
    ones ignore it) and with `token` as bearer; returns (status, decoded JSON or text)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    payload = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if payload is not None else {}
    if signed:
        headers.update(signed_headers(method, url, payload or b""))
    headers.update(bearer(token))
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    kind = response.getheader("Content-Type", "")
    return response.status, json.loads(data) if "json" in kind else data.decode()


class AgentProcess:
    def __init__(self, state_dir: Path, *, cpus: float = 4, memory_mb: int = 4096,
                 extra: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        self.state_dir = state_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [
            sys.executable, "-m", "thaw", "agent", "--port", str(self.port),
            "--state-dir", str(state_dir), "--cpus", str(cpus), "--memory-mb", str(memory_mb),
            "--heartbeat-s", "0.5",
            # oci: layouts the tests build anywhere in this run's temp root
            "--allow-layout", str(state_dir.parent.parent.resolve()),
            "--driver", TEST_DRIVER, *(extra or []),
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = {**os.environ, **ENV, **(env or {})}
        self.log_path = state_dir.parent / f"{state_dir.name}-agent.log"

    def start(self) -> AgentProcess:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT,
                                         env=self.env)
        try:
            proc = self.proc
            wait_for_port("127.0.0.1", self.port, timeout_s=20,
                          alive=lambda: proc.poll() is None)
        except TimeoutError:
            raise RuntimeError(f"agent did not start:\n{self.log_path.read_text()}") from None
        return self

    def kill9(self) -> None:
        """SIGKILL, then wait until nothing listens on the port any more: a child the agent
        forked just before the kill (a `runc` or `nft` it was starting) holds a copy of the
        listening socket until it execs, which takes up to ~100 ms on a loaded machine. A
        connection made meanwhile — the restarted agent's port probe and first call — is
        queued on that ghost and reset when the child's exec closes it."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc = None
        wait_until_unbound(self.port)

    def terminate(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def exit_status(self) -> str:
        """'runs', or how the agent process ended (a signal names who may have killed it)."""
        if self.proc is None:
            return "was stopped by the test"
        try:
            code = self.proc.wait(timeout=2)  # a crash is flushing its traceback
        except subprocess.TimeoutExpired:
            return "still runs"
        return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"

    def machine_pids(self) -> list[int]:
        """Pids the op log knows of that are still those processes, plus unrecorded ones
        found by machine id."""
        return recorded_machine_pids([self.state_dir / "oplog"])

    def close(self) -> None:
        self.cleanup()

    def __enter__(self) -> AgentProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        """Stop the agent, then kill every machine process group it left and remove what
        its machines had on the host."""
        self.terminate()
        for pid in self.machine_pids():
            kill_group(pid)
        sweep(self.state_dir)

    def sockets(self) -> str:
        """Every TCP socket of the agent's port and who holds it (`ss`), for a failure's
        message: a reset from an agent that still runs is not explained yet."""
        try:
            return subprocess.run(["ss", "-tanp", f"( sport = :{self.port} or dport = "
                                   f":{self.port} )"], capture_output=True, text=True,
                                  timeout=10).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            return f"(ss: {exc})\n"

    def wait_state(self, mid: str, state: str, timeout_s: float = 20) -> dict[str, Any]:
        try:
            status, body = call(
                "GET", f"{self.url}/v1/machines/{mid}/wait?state={state}&timeout_s={timeout_s}",
                timeout_s=timeout_s + 5,
            )
        except OSError as exc:  # the agent is gone: how it went, what it said before
            raise AssertionError(f"{exc}; the agent {self.exit_status()}; the sockets of "
                                 f"its port:\n{self.sockets()}its log:\n"
                                 f"{self.log_path.read_text()[-3000:]}") from None
        assert status == 200, (status, body, self.log_path.read_text()[-3000:])
        return body  # type: ignore[no-any-return]


def recorded_machine_pids(oplogs: list[Path]) -> list[int]:
    """The machine processes these op logs record that still run — the pid *and* its start
    time must match, since a recorded pid of a machine long gone may by now be any process
    of the host (pids wrap at 32,768 here: a full test run reuses them) — plus every process
    that carries one of their machine ids."""
    ids: set[str] = set()
    pids: set[int] = set()
    for log in oplogs:
        if not log.exists():
            continue
        state = replay(decode(log.read_bytes()).records)
        ids |= set(state.machines)
        pids |= {m.process.pid for m in state.machines.values()
                 if m.process is not None and same_process(m.process.pid, m.process.start_time)}
    return sorted(pids | set(find_machine_processes(ids)))


def same_process(pid: int, start_time: int) -> bool:
    stat = read_stat(pid)
    return stat is not None and stat.start_time == start_time


def find_machine_processes(machine_ids: set[str]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in environ:
            if item.startswith(b"THAW_MACHINE_ID=") and item[16:].decode() in machine_ids:
                found.append(int(entry))
    return found


def terminate_all(procs: list[subprocess.Popen[bytes]], timeout_s: float = 20) -> None:
    """SIGTERM to each (the last started first), then wait; kill what outstays."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(f"pid {proc.pid} outstayed SIGTERM by {timeout_s}s, killed: {proc.args}",
                  file=sys.stderr)
            proc.kill()
            proc.wait()


def kill_group(pid: int) -> None:
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except (ProcessLookupError, PermissionError):
            pass


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(predicate: Any, timeout_s: float = 10, interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        time.sleep(interval_s)
