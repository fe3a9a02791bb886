"""The multi-host layout (docs/machines.md, "Across hosts"): two worker hosts and an edge
host as network namespaces on one LAN, the control plane (Redis, placement) on the test's
own. Each worker's machines live in a subnet of its own (`--machine-cidr`) that the edge
host routes to that worker's address; the edge dials machines at their own addresses, as
it does on one host. An app's machines on both hosts are served; the loss of one host
fails no request."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent_process import (
    call,
    find_machine_processes,
    kill_group,
    terminate_all,
    wait_until,
)
from tests.support.credentials import ADMIN_TOKEN, ENV, ROUTE_KEY
from tests.support.hostnets import HostNets
from tests.support.load import SteadyLoad
from tests.support.machines import oci_driver_runs, sweep
from tests.support.ports import free_port, wait_for_port
from thaw.imagebuild import build_image

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(not oci_driver_runs() or shutil.which("nft") is None,
                       reason="hosts as namespaces need root, runc and nft (the OCI driver)"),
]
HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"
WORKERS = ("wa", "wb")


class Cluster:
    """Redis and placement on the test's namespace; agents and the edge on their hosts."""

    def __init__(self, tmp: Path, nets: HostNets) -> None:
        self.tmp, self.nets = tmp, nets
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.redis_port, self.api_port, self.edge_port = free_port(), free_port(), free_port()
        self.api = f"http://{nets.root_address}:{self.api_port}"
        self.password = os.urandom(12).hex()
        self.registry = f"redis://:{self.password}@{nets.root_address}:{self.redis_port}/0"
        self.subnets = {w: f"10.{216 + i}.{nets.lan}.0/24" for i, w in enumerate(WORKERS)}

    def start(self) -> Cluster:
        root = self.nets.root_address
        self._spawn("redis", [shutil.which("redis-server") or "/usr/bin/redis-server",
                              "--bind", root, "--port", str(self.redis_port), "--save", "",
                              "--appendonly", "no", "--requirepass", self.password], root,
                    self.redis_port, thaw=False)
        self._spawn("placement", ["placement", "--host", root, "--port", str(self.api_port),
                                  "--state-dir", str(self.tmp / "placement"),
                                  "--allow-layout", str(self.tmp), *self.routes()], root,
                    self.api_port)
        for worker in WORKERS:
            self.start_agent(worker)
        edge = self.nets.addresses["edge"]
        for worker in WORKERS:
            self.nets.route("edge", self.subnets[worker], via=worker)
        self._spawn("edge", ["edge", "--host", edge, "--port", str(self.edge_port),
                             "--placement", self.api, *self.routes()], edge, self.edge_port,
                    on="edge")
        return self

    def routes(self) -> list[str]:
        """The route key's flag: placement's and the edge's, never an agent's."""
        path = self.tmp / "route.key"
        if not path.exists():
            path.touch(mode=0o600)
            path.write_text(ROUTE_KEY + "\n")
        return ["--route-key-file", str(path)]

    def start_agent(self, worker: str) -> None:
        address, port = self.nets.addresses[worker], free_port()
        self._spawn(worker, [
            "agent", "--host", address, "--port", str(port), "--id", worker,
            "--advertise-url", f"http://{address}:{port}", "--state-dir",
            str(self.tmp / worker), "--machine-cidr", self.subnets[worker], "--cpus", "2",
            "--memory-mb", "1024", "--heartbeat-s", "0.5", "--stop-machines-on-exit",
            "--allow-layout", str(self.tmp)], address, port, on=worker)

    def _spawn(self, name: str, args: list[str], host: str, port: int, on: str = "",
               thaw: bool = True) -> None:
        argv = [sys.executable, "-m", "thaw", *args, "--registry", self.registry,
                "--log-level", "warning"] if thaw else args
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 (closed with the process)
        self.procs[name] = subprocess.Popen(
            [*(self.nets.run_in(on) if on else []), *argv], stdout=log,
            stderr=subprocess.STDOUT, env={**os.environ, **ENV})
        log.close()
        proc = self.procs[name]
        try:
            wait_for_port(host, port, timeout_s=30, alive=lambda: proc.poll() is None)
        except TimeoutError as exc:
            raise TimeoutError(f"{name}: {(self.tmp / f'{name}.log').read_text()}") from exc

    def lose(self, worker: str) -> None:
        """The host goes: its LAN link down, its agent and machines kill -9'd."""
        self.nets.cut(worker)
        self.procs[worker].kill()
        self.procs[worker].wait()
        ids = {p.name for p in (self.tmp / worker).glob("machines/*")}
        for pid in find_machine_processes(ids):
            kill_group(pid)

    def machines(self) -> list[dict[str, Any]]:
        status, body = call("GET", f"{self.api}/v1/apps/hello/machines", token=ADMIN_TOKEN)
        assert status == 200, body
        return body  # type: ignore[no-any-return]

    def stop(self) -> None:
        terminate_all(list(self.procs.values()))
        for worker in WORKERS:
            ids = {p.name for p in (self.tmp / worker).glob("machines/*")}
            for pid in find_machine_processes(ids):
                kill_group(pid)
            subprocess.run([*self.nets.run_in(worker), sys.executable, "-m", "thaw", "agent",
                            "--sweep", "--state-dir", str(self.tmp / worker),
                            "--machine-cidr", self.subnets[worker]],
                           env={**os.environ, **ENV}, capture_output=True, check=False)
            sweep(self.tmp / worker)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with HostNets(["wa", "wb", "edge"]) as nets:
        running = Cluster(tmp_path, nets)
        try:
            yield running.start()
        finally:
            running.stop()


def test_machines_on_two_hosts_are_served_through_an_edge_on_a_third_and_a_lost_host_fails_no_request(  # noqa: E501
    cluster: Cluster, tmp_path: Path
) -> None:
    build_image(HELLO, "hello:v1", layout=tmp_path / "layout")
    wait_until(lambda: len(call("GET", f"{cluster.api}/v1/workers", token=ADMIN_TOKEN)[1]) == 2,
               30)
    status, body = call("POST", f"{cluster.api}/v1/apps", token=ADMIN_TOKEN, body={
        "name": "hello", "image": f"oci:{tmp_path / 'layout'}:v1", "idle_timeout_s": 300,
        "min_machines_running": 2, "guest": {"cpus": 0.5, "memory_mb": 128},
    })
    assert status == 201, body

    def started_on_both() -> bool:
        machines = [m for m in cluster.machines() if m["state"] == "started"]
        return {m["worker"] for m in machines} == set(WORKERS)

    try:
        wait_until(started_on_both, 60)
    except AssertionError:
        print(cluster.machines())
        for name in ("wa", "wb", "placement", "edge"):
            print(name, (tmp_path / f"{name}.log").read_text()[-3000:])
        raise
    by_machine = {m["id"]: m for m in cluster.machines() if m["state"] == "started"}
    for machine in by_machine.values():  # each in its own host's subnet
        prefix = cluster.subnets[machine["worker"]].rsplit(".", 1)[0]
        assert machine["address"].startswith(prefix + "."), machine

    edge = cluster.nets.addresses["edge"]
    with SteadyLoad(cluster.edge_port, "hello.localhost", rate=40, address=edge) as load:
        wait_until(lambda: any(a.status == 200 for a in load.answers), 20)
        first = next(a.body.split()[-1] for a in load.answers if a.status == 200)
        lost = by_machine[first]["worker"]  # the host whose machine serves goes
        [kept] = [w for w in WORKERS if w != lost]
        lost_at = time.monotonic()
        cluster.lose(lost)
        wait_until(lambda: any(a.status == 200 and a.started > lost_at + 1.0
                               for a in load.answers), 30)
        time.sleep(2.0)

    codes = Counter(a.status for a in load.answers)
    assert codes == Counter({200: len(load.answers)}), [
        (round(a.started - lost_at, 2), round(a.seconds, 2), a.status, a.body[:200])
        for a in load.answers if a.status != 200]
    after = {a.body.split()[-1] for a in load.between(lost_at + 3.0)}
    where = {m["id"]: m["worker"] for m in [*by_machine.values(), *cluster.machines()]}
    assert after and {where[m] for m in after} == {kept}, after  # a replacement counts
