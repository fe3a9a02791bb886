"""A machine's network (the OCI driver): its own namespace, and an egress policy that
walls it off from the host, the other machines and every private range while public
addresses go out through NAT. Real agent, real runc, real nftables; a probe app reports
from inside (tests/e2e/apps/probe). The "public" address is one of a namespace this test
makes itself (11.213.x.x, outside every blocked range), so nothing leaves this host."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent_process import AgentProcess, call
from tests.support.credentials import ENV
from tests.support.machines import oci_driver_runs
from tests.support.ports import free_port, wait_for_port
from tests.support.postgres import PostgresServer
from thaw.imagebuild import build_image

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not oci_driver_runs() or shutil.which("nft") is None,
                       reason="machine networks need root, runc and nft (the OCI driver)"),
]
PROBE = Path(__file__).resolve().parents[1] / "e2e" / "apps" / "probe"
GUEST = {"cpus": 0.5, "memory_mb": 128}
REFUSED = {"ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH", "EACCES", "EPERM"}


@pytest.fixture(scope="module")
def probe_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("images")
    source = root / "probe-src"
    source.mkdir()
    for item in PROBE.iterdir():
        (source / item.name).write_bytes(item.read_bytes())
    build_image(source, "probe:v1", layout=root / "layout")
    return f"oci:{root / 'layout'}:probe:v1"


def agent_with(tmp_path_factory: pytest.TempPathFactory, name: str,
               extra: list[str]) -> AgentProcess:
    """An agent listening on every host address, as one on a real host would."""
    process = AgentProcess(tmp_path_factory.mktemp(name) / "agent", cpus=8, memory_mb=8192,
                           extra=["--host", "0.0.0.0", *extra])
    process.args += ["--advertise-url", process.url]  # what its signed calls name
    return process.start()


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    process = agent_with(tmp_path_factory, "net", [])
    yield process
    process.cleanup()


@pytest.fixture(scope="module")
def closed_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    process = agent_with(tmp_path_factory, "closed", ["--machine-egress", "none"])
    yield process
    process.cleanup()


@pytest.fixture(scope="module")
def host_redis() -> Iterator[int]:
    """A real redis-server on every host address (as a control plane host's would be)."""
    port = free_port()
    proc = subprocess.Popen([shutil.which("redis-server") or "/usr/bin/redis-server",
                             "--bind", "0.0.0.0", "--port", str(port), "--save", "",
                             "--appendonly", "no", "--protected-mode", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port("127.0.0.1", port, timeout_s=10)
        yield port
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def host_services(tmp_path_factory: pytest.TempPathFactory, host_redis: int
                  ) -> Iterator[dict[str, int]]:
    """The control plane's services on every host address, as on a host that runs them
    beside its machines: Redis, PostgreSQL, placement (API and admin listener), an edge
    (proxy; its admin port binds loopback only, no flag widens it)."""
    work = tmp_path_factory.mktemp("services")
    ports = {"redis": host_redis, "placement": free_port(), "placement admin": free_port(),
             "edge": free_port(), "edge admin": free_port()}
    postgres = PostgresServer(listen="*")
    postgres.start()
    ports["postgresql"] = postgres.port
    placement = [sys.executable, "-m", "thaw", "placement", "--host", "0.0.0.0", "--port",
                 str(ports["placement"]), "--admin-host", "0.0.0.0", "--admin-port",
                 str(ports["placement admin"]), "--state-dir", str(work / "placement"),
                 "--registry", "memory", "--log-level", "warning"]
    edge = [sys.executable, "-m", "thaw", "edge", "--host", "0.0.0.0", "--port",
            str(ports["edge"]), "--admin-port", str(ports["edge admin"]), "--placement",
            f"http://127.0.0.1:{ports['placement']}", "--registry", "memory",
            "--log-level", "warning"]
    procs = [subprocess.Popen(argv, env={**os.environ, **ENV}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for argv in (placement, edge)]
    try:
        for name in ("placement", "placement admin", "edge", "edge admin"):
            wait_for_port("127.0.0.1", ports[name], timeout_s=30)
        yield ports
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=20)
        postgres.stop()


@pytest.fixture(scope="module")
def public_host() -> Iterator[str]:
    """ip:port of a TCP server in a namespace of this test's own, at a public-range
    address routed from the host: what "the internet" is for these tests."""
    tag = os.urandom(3).hex()
    ns, outer, inner = f"thwpub-{tag}", f"tpub{tag}", f"tpubi{tag}"
    net = f"11.213.{int(tag[:2], 16)}"
    script = [f"netns add {ns}", f"link add {outer} type veth peer name {inner} netns {ns}",
              f"addr add {net}.1/30 dev {outer}", f"link set {outer} up",
              f"-n {ns} addr add {net}.2/30 dev {inner}", f"-n {ns} link set {inner} up",
              f"-n {ns} link set lo up"]
    for line in script:
        subprocess.run(["ip", *line.split()], check=True)
    port = free_port()
    server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", (
        "import socket\n"
        f"s = socket.create_server(('{net}.2', {port}))\n"
        "while True:\n"
        "    c, a = s.accept(); c.sendall(a[0].encode()); c.close()\n")])
    try:
        yield f"{net}.2:{port}"
    finally:
        server.kill()
        server.wait()
        subprocess.run(["ip", "link", "del", outer], check=False)
        subprocess.run(["ip", "netns", "del", ns], check=False)


def started(agent: AgentProcess, image: str) -> dict[str, Any]:
    body = {"key": os.urandom(6).hex(), "app": f"net-{os.urandom(3).hex()}", "image": image,
            "guest": GUEST, "start": True}
    status, machine = call("POST", f"{agent.url}/v1/offers", body)
    assert status == 201, machine
    return agent.wait_state(machine["id"], "started")


def ask(machine: dict[str, Any], path: str, timeout_s: float = 15) -> Any:
    with urllib.request.urlopen(f"http://{machine['address']}{path}", timeout=timeout_s) as r:
        return json.loads(r.read())


def connect_from(machine: dict[str, Any], targets: list[str]) -> dict[str, str]:
    return ask(machine, "/connect?" + "&".join(f"to={t}" for t in targets))  # type: ignore


def host_addresses() -> list[str]:
    """The host's own IPv4 addresses other than loopback and the machines' links."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True,
                         check=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split()
        name, address = parts[1], parts[3].split("/")[0]
        if name != "lo" and not name.startswith(("th", "tpub")):
            found.append(address)
    return found


def gateway(machine: dict[str, Any]) -> str:
    """The host end of the machine's link (its default route)."""
    host, _ = machine["address"].rsplit(":", 1)
    last = int(host.rsplit(".", 1)[1]) - 1
    return f"{host.rsplit('.', 1)[0]}.{last}"


def test_a_machine_reaches_no_port_of_the_host_no_other_machine_and_no_private_address(
    agent: AgentProcess, probe_image: str, host_services: dict[str, int]
) -> None:
    machine, other = started(agent, probe_image), started(agent, probe_image)
    own_host = gateway(machine)
    services = {"agent": agent.port, **host_services}
    targets = {f"{name} at {host}": f"{host}:{port}" for name, port in services.items()
               for host in [own_host, *host_addresses()]
               if name != "edge admin" or host == own_host}
    targets["another machine"] = other["address"]
    targets["another machine's host end"] = f"{gateway(other)}:{agent.port}"
    targets["metadata"] = "169.254.169.254:80"
    targets["a private LAN address"] = "192.168.213.1:80"
    for name, target in targets.items():  # the control: from the host, these answer
        if not name.startswith(("metadata", "a private", "edge admin")):
            socket.create_connection(tuple(target.rsplit(":", 1)), timeout=2).close()  # type: ignore[arg-type]

    seen = connect_from(machine, list(targets.values()))

    outcome = {name: seen[target] for name, target in targets.items()}
    assert {n: r for n, r in outcome.items() if r not in REFUSED} == {}


def test_a_machines_own_loopback_is_its_own(agent: AgentProcess, probe_image: str,
                                             host_redis: int) -> None:
    machine = started(agent, probe_image)
    port = machine["address"].rsplit(":", 1)[1]

    seen = connect_from(machine, [f"127.0.0.1:{port}", f"127.0.0.1:{host_redis}",
                                  f"127.0.0.1:{agent.port}"])

    assert seen[f"127.0.0.1:{port}"] == "ok"  # the probe itself
    assert seen[f"127.0.0.1:{host_redis}"] == "ECONNREFUSED"
    assert seen[f"127.0.0.1:{agent.port}"] == "ECONNREFUSED"


def test_public_addresses_go_out_through_nat_unless_the_agent_says_none(
    agent: AgentProcess, closed_agent: AgentProcess, probe_image: str, public_host: str
) -> None:
    open_machine, closed_machine = started(agent, probe_image), started(closed_agent,
                                                                        probe_image)

    assert connect_from(open_machine, [public_host])[public_host] == "ok"
    assert connect_from(closed_machine, [public_host])[public_host] in REFUSED
    resolv = ask(closed_machine, "/files?path=/etc/resolv.conf")["/etc/resolv.conf"]
    assert "nameserver" not in resolv.replace("# ", "")


def sniff_in(machine: dict[str, Any], needle: str) -> subprocess.Popen[str]:
    """The probe's sniffer run as the host's root in the machine's network namespace:
    everything a machine could capture were it given NET_RAW."""
    code = (f"import json, sys; sys.path.insert(0, {str(PROBE)!r}); from app import sniff; "
            f"print(json.dumps(sniff(2.5, {needle!r}.encode())))")
    return subprocess.Popen(["ip", "netns", "exec", f"thaw-{machine['id']}", sys.executable,
                             "-c", code], stdout=subprocess.PIPE, text=True)


def test_a_machine_cannot_sniff_and_its_namespace_shows_none_of_another_machines_traffic(
    agent: AgentProcess, probe_image: str
) -> None:
    victim, sniffer = started(agent, probe_image), started(agent, probe_image)
    needle = "thaw_" + os.urandom(8).hex()
    captured = {}
    for target, name in ((victim, "victim's"), (sniffer, "own")):
        capture = sniff_in(sniffer, needle)
        threading.Event().wait(1.0)  # its socket is open by then
        for _ in range(10):
            request = urllib.request.Request(f"http://{target['address']}/status",
                                             headers={"Authorization": f"Bearer {needle}"})
            urllib.request.urlopen(request, timeout=5).read()
        out, _ = capture.communicate(timeout=20)
        captured[name] = json.loads(out)

    assert ask(sniffer, "/sniff?s=0.1") == {"error": "EPERM"}  # no NET_RAW in a machine
    assert captured["own"]["seen"], captured  # the sniffer works: its own traffic shows
    assert not captured["victim's"]["seen"], captured
    assert set(captured["own"]["all_interfaces"]) == {"lo", "eth0"}, captured
