"""`thaw up` as a user starts it: a subprocess on free ports with a temp state dir."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.agent_process import kill_group, recorded_machine_pids
from tests.support.machines import sweep
from tests.support.ports import free_ports


class ThawUp:
    def __init__(self, state_dir: Path, *, agents: int = 2, hello: list[str] | None = None,
                 extra: list[str] | None = None):
        self.state_dir = state_dir
        self.cli_config = state_dir.parent / f"{state_dir.name}-cli"  # its CLI contexts
        self.agents, self.hello, self.extra = agents, hello or [], extra or []
        self._choose_ports()
        self.proc: subprocess.Popen[bytes] | None = None
        self.output = b""
        self.token = ""  # the admin token `thaw up` made (read once it is up)

    def _choose_ports(self) -> None:
        # one call: three distinct ports (three separate picks may draw the same one)
        self.edge_port, self.api_port, self.admin_port = free_ports(3)
        # with --tls the API is HTTPS only (its CA: state_dir/tls/ca.pem)
        scheme = "https" if "--tls" in self.extra else "http"
        self.api = f"{scheme}://127.0.0.1:{self.api_port}"
        self.edge = f"http://127.0.0.1:{self.edge_port}"
        self.admin = f"http://127.0.0.1:{self.admin_port}"
        self.args = [
            sys.executable, "-m", "thaw", "up", "--state-dir", str(self.state_dir),
            "--edge-port", str(self.edge_port), "--api-port", str(self.api_port),
            "--admin-port", str(self.admin_port), "--agents", str(self.agents),
            *[arg for item in self.hello for arg in ("--hello-set", item)],
            # oci: layouts the tests build anywhere in this run's temp root
            "--allow-layout", str(self.state_dir.parent.resolve()), *self.extra,
        ]

    def start(self, timeout_s: float = 60, tries: int = 3) -> ThawUp:
        """Start `thaw up` and wait for its banner. A port free when chosen may be bound by
        some other process before `thaw up` binds it: then it is started again on new
        ports (up to `tries` times), as a user would pick another port."""
        for attempt in range(tries):
            try:
                return self._start_once(timeout_s)
            except RuntimeError as failed:
                if "address already in use" not in str(failed) or attempt == tries - 1:
                    raise
                self.output = b""
                self._choose_ports()
        raise AssertionError("unreachable")

    def _start_once(self, timeout_s: float) -> ThawUp:
        self.proc = subprocess.Popen(
            self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            # the CLI's contexts of this platform alone (not the user's ~/.config/thaw)
            env={**os.environ, "THAW_LOG_LEVEL": "warning", "THAW_CONFIG": str(self.cli_config)},
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while b"curl -H" not in self.output:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.output += self.proc.stdout.read() if self.proc.poll() is not None else b""
                self.stop()
                raise RuntimeError(f"thaw up did not come up:\n{self.output.decode()}")
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                self.output += os.read(self.proc.stdout.fileno(), 65536)
        self.token = (self.state_dir / "admin.token").read_text().strip()
        return self

    def more_output(self) -> str:
        """What `thaw up` printed since the banner (read without waiting), for a failure's
        message."""
        if self.proc is None or self.proc.stdout is None:
            return ""
        while select.select([self.proc.stdout], [], [], 0)[0]:
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                break
            self.output += chunk
        return self.output.decode(errors="replace")[-4000:]

    def stop(self) -> int | None:
        """SIGTERM, as Ctrl-C would; returns the exit status."""
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.proc = None
        return code

    def machine_pids(self) -> list[int]:
        return recorded_machine_pids(sorted(self.state_dir.glob("agent-*/oplog")))

    def cleanup(self) -> None:
        self.stop()
        for pid in self.machine_pids():
            kill_group(pid)
        for agent_dir in self.state_dir.glob("agent-*"):
            sweep(agent_dir)
