"""The platform as separate processes on this host, for the host-loss scenario: a
redis-server of its own, `thaw placement`, N `thaw agent`s and `thaw edge`, each its own
process, as an operator runs them (README, "Running the services separately"). Killing
one agent process and its machines is then what losing one host is.

    python -m loadtests.kit.separate [--agents 3] [--state-dir DIR]

makes a cluster key and an admin token in the state dir, builds examples/hello into an
OCI layout there, creates app `hello`, prints the `thaw loadtest` parameters and runs
until Ctrl-C or SIGTERM, then stops every process it started (and the machines of any
agent left running). Loopback only; redis-server must be installed (make sysdeps).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent.config import AgentConfig
from agent.drivers import sweep
from ground.auth.secrets_files import (
    ADMIN_TOKEN_FILE,
    CLUSTER_KEY_FILE,
    ROUTE_KEY_FILE,
    ensure_secret,
)
from ground.auth.signing import KeyRing
from thaw.client import ApiClient, ApiError
from thaw.imagebuild import build_image
from thaw.up import EXAMPLE, HELLO_APP


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path,
                  timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{log.stem} exited {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s:g} s")


class SeparatePlatform:
    def __init__(self, state: Path, agents: int = 3) -> None:
        self.state = state.resolve()
        self.agents = agents
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.edge_port, self.api_port = free_port(), free_port()
        self.api = f"http://127.0.0.1:{self.api_port}"
        self.edge = f"http://127.0.0.1:{self.edge_port}"
        self.token = ""
        self.redis = ""  # its URL, once started

    def spawn(self, name: str, argv: list[str], port: int) -> None:
        log = self.state / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.procs[name] = proc
        wait_for_port(port, proc, log)

    def thaw(self, name: str, *args: str, port: int) -> None:
        common = ["--cluster-key-file", str(self.state / CLUSTER_KEY_FILE),
                  "--log-level", "warning"]
        self.spawn(name, [sys.executable, "-m", "thaw", *args, "--registry", self.redis,
                          *common], port)

    def start(self) -> SeparatePlatform:
        self.state.mkdir(parents=True, exist_ok=True)
        ensure_secret(self.state / CLUSTER_KEY_FILE)
        ensure_secret(self.state / ROUTE_KEY_FILE)
        self.token = ensure_secret(self.state / ADMIN_TOKEN_FILE)
        redis_port = free_port()
        self.redis = f"redis://127.0.0.1:{redis_port}/0"
        (self.state / "redis").mkdir(exist_ok=True)
        self.spawn("redis", [redis_binary(), "--port", str(redis_port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no",
                             "--dir", str(self.state / "redis")], redis_port)
        layouts = ["--allow-layout", str(self.state / "images")]
        routes = ["--route-key-file", str(self.state / ROUTE_KEY_FILE)]  # not the agents'
        self.thaw("placement", "placement", "--port", str(self.api_port), "--state-dir",
                  str(self.state / "placement"), "--admin-token-file",
                  str(self.state / ADMIN_TOKEN_FILE), *layouts, *routes, port=self.api_port)
        for i in range(self.agents):
            port = free_port()
            self.thaw(f"agent-{i}", "agent", "--port", str(port), "--id", f"w{i}",
                      "--state-dir", str(self.state / f"agent-{i}"), "--cpus", "4",
                      "--memory-mb", "4096", "--heartbeat-s", "0.5",
                      "--stop-machines-on-exit", *layouts, port=port)
        self.thaw("edge", "edge", "--port", str(self.edge_port), "--placement", self.api,
                  *routes, "--new-conns-per-s", "1000000", "--max-conns-per-client",
                  "1000000", "--max-held-per-client", "1000000", "--new-conns-burst", "1000000",
                  "--max-tunnels-per-client", "1000000",
                  port=self.edge_port)  # the load comes from this host, one address
        self.create_hello()
        return self

    def create_hello(self) -> None:
        layout = self.state / "images" / "layout"
        build_image(EXAMPLE, "hello:latest", layout=layout)
        client = ApiClient(self.api, self.token)
        try:
            client.post("/v1/apps", {**HELLO_APP, "image": f"oci:{layout}:latest"})
        except ApiError as exc:
            if exc.status != 409:
                raise

    def stop(self) -> None:
        """SIGTERM every process (agents stop their machines), SIGKILL what lingers."""
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        keys = KeyRing.parse(ensure_secret(self.state / CLUSTER_KEY_FILE))
        for agent_dir in self.state.glob("agent-*"):  # a host killed by host-loss left these
            asyncio.run(sweep(AgentConfig(state_dir=agent_dir, cluster_keys=keys)))

    def banner(self) -> str:
        return "\n".join([
            f"thaw as separate processes (redis, placement, {self.agents} agents, edge); "
            f"state and logs in {self.state}",
            f"  curl -H 'Host: hello.localhost' {self.edge}/",
            f"  export THAW_TOKEN=$(cat {self.state / ADMIN_TOKEN_FILE})",
            f"  thaw loadtest host-loss --base-url {self.edge} --api {self.api}",
            "Ctrl-C stops everything.",
        ])


def redis_binary() -> str:
    found = shutil.which("redis-server") or "/usr/sbin/redis-server"
    if not Path(found).exists():
        raise RuntimeError("redis-server is not installed (make sysdeps, or apt-get install "
                           "redis-server)")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=3, help="how many `thaw agent`s")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="state, keys and logs (default: a new temp dir, removed after)")
    args = parser.parse_args()
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="thaw-separate-"))
    platform = SeparatePlatform(state, args.agents)
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        platform.start()
        print(platform.banner(), flush=True)
        while not stop:
            time.sleep(0.2)
    finally:
        platform.stop()
        if args.state_dir is None:
            shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
