"""Every service as its own process (placement, agents, edge) meeting in a real Redis, as
an operator runs them: for the end-to-end tests and the failover benchmark."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from tests.support.agent_process import (
    call,
    find_machine_processes,
    kill_group,
    terminate_all,
)
from tests.support.credentials import ADMIN_TOKEN, ENV, ROUTE_KEY, SECRETS_KEY
from tests.support.machines import sweep
from tests.support.ports import free_ports, wait_for_port, wait_until_unbound
from tests.support.redis_server import RedisServer


class Services:
    def __init__(self, tmp: Path, redis_url: str, agents: int = 2, *, placements: int = 1,
                 edges: int = 1, store: str = "", agent_cpus: float = 2,
                 agent_memory_mb: int = 1024, heartbeat_s: float = 0.5,
                 locked: RedisServer | None = None, every_placement: bool = False,
                 start_timeout_s: float = 20, placement_args: tuple[str, ...] = (),
                 edge_args: tuple[str, ...] = ()) -> None:
        """`placements` share `store` (a postgresql:// URL; "" is each one's own SQLite);
        edge i asks placement i % placements. The first of each is `placement`/`edge`.
        `heartbeat_s`: the agents' (short in tests, so that a dead one is seen soon).
        `locked`: a Redis with ACLs (`redis_url` unused): each service connects as its
        role's user, an agent as its worker's own (`agent-w0`…), password from a file.
        `every_placement`: each edge is given every placement's URL (its own first).
        `start_timeout_s`: how long each may take to listen (a placement publishes every
        stored app first). `placement_args`: more flags for every placement; `edge_args`:
        for every edge."""
        self.tmp = tmp
        self.redis_url = redis_url
        self.agents = agents
        self.store = store
        self.agent_size = (str(agent_cpus), str(agent_memory_mb))
        self.heartbeat_s = heartbeat_s
        self.locked = locked
        self.every_placement = every_placement
        self.start_timeout_s = start_timeout_s
        self.placement_args = placement_args
        self.edge_args = edge_args
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.args: dict[str, tuple[list[str], int]] = {}
        # every port up front, distinct (an agent's, chosen later, could have been one
        # given to an edge's admin listener that was not bound yet)
        ports = iter(free_ports(2 * placements + 2 * edges + agents))
        self.api_ports = [next(ports) for _ in range(placements)]
        self.placement_admins = [f"http://127.0.0.1:{next(ports)}" for _ in range(placements)]
        self.edge_ports = [next(ports) for _ in range(edges)]
        self.admin_ports = [next(ports) for _ in range(edges)]
        self.agent_ports = [next(ports) for _ in range(agents)]
        self.api_port, self.edge_port, self.admin_port = (
            self.api_ports[0], self.edge_ports[0], self.admin_ports[0])
        self.apis = [f"http://127.0.0.1:{port}" for port in self.api_ports]
        self.api = self.apis[0]

    def spawn(self, name: str, *args: str, port: int) -> None:
        self.args[name] = (list(args), port)
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen([sys.executable, "-m", "thaw", *args, *self.registry_args(args),
                                 "--log-level",
                                 os.environ.get("THAW_TEST_LOG_LEVEL", "warning")],
                                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **ENV})
        log.close()
        self.procs[name] = proc
        wait_for_port("127.0.0.1", port, timeout_s=self.start_timeout_s)

    def registry_args(self, args: tuple[str, ...]) -> list[str]:
        if self.locked is None:
            return ["--registry", self.redis_url]
        user = args[0] if args[0] != "agent" else f"agent-{args[args.index('--id') + 1]}"
        return ["--registry", self.locked.plain_url(user),
                "--registry-password-file", str(self.locked.password_file(user))]

    def start(self) -> Services:
        layouts = ("--allow-layout", str(self.tmp))
        store = ("--store", self.store) if self.store else ()
        key_file = self.tmp / "secrets.key"  # one for every placement: they share a store
        key_file.touch(mode=0o600)
        key_file.write_text(SECRETS_KEY + "\n")
        route_file = self.tmp / "route.key"  # placements' and edges' only, never agents'
        route_file.touch(mode=0o600)
        route_file.write_text(ROUTE_KEY + "\n")
        routes = ("--route-key-file", str(route_file))
        for i, port in enumerate(self.api_ports):
            name = "placement" if i == 0 else f"placement-{i}"
            self.spawn(name, "placement", "--port", str(port), "--state-dir",
                       str(self.tmp / name), "--admin-port",
                       self.placement_admins[i].rsplit(":", 1)[1], *store, *layouts,
                       "--secrets-key-file", str(key_file), *routes, *self.placement_args,
                       port=port)
        for i in range(self.agents):
            port = self.agent_ports[i]
            self.spawn(f"agent-{i}", "agent", "--port", str(port), "--id", f"w{i}",
                       "--state-dir", str(self.tmp / f"agent-{i}"), "--cpus", self.agent_size[0],
                       "--memory-mb", self.agent_size[1], "--heartbeat-s",
                       str(self.heartbeat_s),
                       "--stop-machines-on-exit", *layouts, port=port)
        for i, (port, admin) in enumerate(zip(self.edge_ports, self.admin_ports, strict=True)):
            own = i % len(self.apis)
            urls = self.apis[own:] + self.apis[:own] if self.every_placement else [
                self.apis[own]]
            # every test client is 127.0.0.1: the per-client limits are lifted (their
            # own tests are tests/integration/test_edge_client_limits.py)
            self.spawn("edge" if i == 0 else f"edge-{i}", "edge", "--port", str(port),
                       "--admin-port", str(admin), "--placement", ",".join(urls), *routes,
                       "--new-conns-per-s", "1000000", "--max-conns-per-client", "1000000",
                       "--max-held-per-client", "1000000", "--new-conns-burst", "1000000",
                       "--max-tunnels-per-client", "1000000", *self.edge_args,
                       port=port)
        return self

    def kill_host(self, index: int) -> None:
        """kill -9 of agent `index` and of every machine process it started: a host lost."""
        proc = self.procs[f"agent-{index}"]
        proc.kill()
        proc.wait()
        wait_until_unbound(self.args[f"agent-{index}"][1])
        ids = {p.name for p in (self.tmp / f"agent-{index}").glob("machines/*")}
        for pid in find_machine_processes(ids):
            kill_group(pid)

    def destroyed_on(self, worker: str, app: str, machine_id: str) -> bool:
        """Whether the agent of `worker` (w0, w1…) no longer runs `machine_id` of `app`."""
        port = self.args[f"agent-{worker[1:]}"][1]
        _, views = call("GET", f"http://127.0.0.1:{port}/v1/machines?app={app}")
        return all(v["id"] != machine_id or v["state"] == "destroyed" for v in views)

    def restart(self, name: str) -> None:
        args, port = self.args[name]
        self.spawn(name, *args, port=port)

    def machines_at_agents(self) -> Counter[str]:
        """Machines that exist (not destroyed) by app, asked of every agent."""
        found: Counter[str] = Counter()
        for port in self.agent_ports:
            status, views = call("GET", f"http://127.0.0.1:{port}/v1/machines")
            assert status == 200, views
            found.update(v["app"] for v in views if v["state"] != "destroyed")
        return found

    def __enter__(self) -> Services:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        terminate_all(list(self.procs.values()))
        ids = {p.name for p in (self.tmp).glob("agent-*/machines/*")}
        for pid in find_machine_processes(ids):
            kill_group(pid)
        for agent_dir in self.tmp.glob("agent-*"):
            sweep(agent_dir)  # what killed hosts left: containers, mounts, namespaces


def edge_get(services: Services, host: str,
             edge: int = 0) -> tuple[int, str, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", services.edge_ports[edge], timeout=30)
    try:
        conn.request("GET", "/", headers={"Host": host})
        response = conn.getresponse()
        return response.status, response.read().decode(), dict(response.getheaders())
    finally:
        conn.close()


def app_machines(services: Services, app: str = "hello") -> list[dict[str, Any]]:
    status, machines = call("GET", f"{services.api}/v1/apps/{app}/machines", token=ADMIN_TOKEN)
    assert status == 200, machines
    return machines  # type: ignore[no-any-return]
