"""What a machine's own network costs (issue 24), side by side in one run.

    .venv/bin/python loadtests/bench_net.py [--creates 20] [--rounds 5] [--duration 5]

1. Cold: a full create under the OCI driver, interleaved with and without the egress
   rules (the link's two `ip` batches alone, as before, vs the same with the machine's
   nftables element added beside them): the network step and the whole launch, p50/p99.
   A spare's or a stopped machine's link is made when it is prepared, so its start (the
   cold path) has no network step at all; a full create pays the step below.
2. Warm: req/s and latency through the edge to the same nginx (1 worker, a fixed 200)
   on loopback vs inside a network namespace behind a /31 veth named like a machine's
   (`th…`, so its packets cross the machines' nftables table as a machine's do), wrk on
   loopback, rounds interleaved; the edge pinned to core 0, nginx and wrk to core 1.

Needs root, runc, ip, nft, nginx, wrk. Writes the `net` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent import ocidriver
from agent.oci import egress
from agent.outputs import Outputs
from loadtests.benchlib import (
    WrkResult,
    free_port,
    key_file,
    machine_line,
    median,
    percentile,
    process,
    wait_port,
    write_section,
    wrk,
)
from loadtests.profile_oci_create import tiny_machine
from tests.support.machines import app_rootfs

NGINX = """
worker_processes 1; daemon off; pid {dir}/{name}.pid; error_log {dir}/{name}.err;
events {{ worker_connections 4096; }}
http {{ access_log off; keepalive_requests 1000000;
  server {{ listen {address}:{port}; location / {{ return 200 "ok\\n"; }} }} }}
"""
VARIANTS = ("ip only", "ip + nft")


# -- cold: the network step of a full create -------------------------------------------

async def creates(rootfs: Path, work: Path, count: int) -> dict[str, dict[str, list[float]]]:
    state = work / "state"
    (state / "machines").mkdir(parents=True, mode=0o700)
    driver = ocidriver.OciDriver(state)
    real_allow, real_drop = egress.allow, egress.drop
    times: dict[str, dict[str, list[float]]] = {v: {"network": [], "launch": []}
                                                for v in VARIANTS}
    link_up = driver._link_up
    current: list[str] = [VARIANTS[0]]

    async def timed_link_up(link: Any, pid: int) -> None:
        began = time.perf_counter()
        try:
            await link_up(link, pid)
        finally:
            times[current[0]]["network"].append((time.perf_counter() - began) * 1000)

    async def no_egress(*_: Any) -> None:
        return None

    driver._link_up = timed_link_up  # type: ignore[method-assign]
    outputs = Outputs()
    try:
        await egress.install(ocidriver.DEFAULT_RUN_DIR)  # once, as an agent's first machine
        for n in range(count * 2):
            variant = VARIANTS[n % 2]
            current[0] = variant
            egress.allow, egress.drop = ((no_egress, no_egress) if variant == VARIANTS[0]
                                         else (real_allow, real_drop))
            spec = tiny_machine(state, outputs, f"net{n:011d}", rootfs)
            began = time.perf_counter()
            run = await driver.launch(spec)
            times[variant]["launch"].append((time.perf_counter() - began) * 1000)
            await driver.stop(run, signal.SIGKILL, 1)
            await driver.destroy(spec.machine_id, spec.machine_dir)
    finally:
        egress.allow, egress.drop = real_allow, real_drop
        await driver.sweep(state / "machines")
        outputs.close_all()
    return times


# -- warm: loopback vs a veth ------------------------------------------------------------

@contextlib.contextmanager
def veth_namespace(tag: str) -> Iterator[tuple[str, str]]:
    """A namespace linked to the host like a machine: (its name, its address)."""
    ns, host_if = f"thwnet-{tag}", f"thbench{tag}"
    host_ip, inner_ip = "10.212.255.0", "10.212.255.1"  # outside the agents' default pool
    steps = [["netns", "add", ns],
             ["link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns],
             ["addr", "add", f"{host_ip}/31", "dev", host_if], ["link", "set", host_if, "up"],
             ["-n", ns, "addr", "add", f"{inner_ip}/31", "dev", "eth0"],
             ["-n", ns, "link", "set", "eth0", "up"], ["-n", ns, "link", "set", "lo", "up"]]
    try:
        for step in steps:
            subprocess.run(["ip", *step], check=True)
        yield ns, inner_ip
    finally:
        subprocess.run(["ip", "link", "del", host_if], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


async def seed(url: str, backends: dict[str, str]) -> None:
    from ground.appconfig import parse
    from ground.registry.redis import RedisRegistry
    from ground.registry.types import MachineRecord

    registry = RedisRegistry(url)
    now = time.time()
    for app, address in backends.items():
        await registry.put_app(parse({
            "name": app, "image": "bench:latest", "max_machines": 1, "auto_stop": "off",
            "concurrency": {"type": "requests", "soft_limit": 10000, "hard_limit": 10000},
        }))
        await registry.put_machine(MachineRecord(
            id=f"{app}-1", app=app, worker="bench", region="local", state="started",
            image_digest="", created_at=now, updated_at=now, address=address))
    await registry.close()


def warm(args: argparse.Namespace, work: Path) -> dict[str, list[WrkResult]]:
    ports = {name: free_port() for name in ("lo", "veth", "edge", "admin", "redis")}
    results: dict[str, list[WrkResult]] = {"loopback": [], "veth": []}
    asyncio.run(egress.install(ocidriver.DEFAULT_RUN_DIR))
    with veth_namespace(os.urandom(3).hex()) as (ns, inner_ip):
        for name, address in (("lo", "127.0.0.1"), ("veth", inner_ip)):
            (work / f"{name}.conf").write_text(NGINX.format(dir=work, name=name,
                                                            address=address, port=ports[name]))
        redis_url = f"redis://127.0.0.1:{ports['redis']}/0"
        edge = [sys.executable, "-m", "thaw", "edge", "--registry", redis_url, "--port",
                str(ports["edge"]), "--admin-port", str(ports["admin"]), "--placement",
                "http://127.0.0.1:9", "--log-level", "warning", "--cluster-key-file",
                str(key_file(work))]
        with (
            process(["nginx", "-c", str(work / "lo.conf")], cpu=1),
            process(["ip", "netns", "exec", ns, "nginx", "-c", str(work / "veth.conf")], cpu=1),
            process(["redis-server", "--port", str(ports["redis"]), "--bind", "127.0.0.1",
                     "--save", "", "--appendonly", "no", "--dir", str(work)], cpu=1),
        ):
            wait_port(ports["lo"])
            wait_port(ports["redis"])
            asyncio.run(seed(redis_url, {"lo": f"127.0.0.1:{ports['lo']}",
                                         "veth": f"{inner_ip}:{ports['veth']}"}))
            with process(edge, cpu=0, log=work / "edge.log"):
                wait_port(ports["edge"])
                url = f"http://127.0.0.1:{ports['edge']}/"
                targets = {"loopback": "lo.localhost", "veth": "veth.localhost"}
                for host in targets.values():
                    wrk(url, host=host, connections=args.connections, duration_s=1, cpu=1)
                for round_no in range(args.rounds):
                    order = list(targets.items())
                    if round_no % 2:
                        order.reverse()
                    for name, host in order:
                        result = wrk(url, host=host, connections=args.connections,
                                     duration_s=args.duration, cpu=1)
                        results[name].append(result)
                        print(f"round {round_no + 1} {name:8s} {result.requests_per_s:8.0f} "
                              f"req/s p50 {result.p50_ms:.3f} ms p99 {result.p99_ms:.3f} ms "
                              f"errors {result.errors}", flush=True)
    return results


# -- report ------------------------------------------------------------------------------

def report(args: argparse.Namespace, cold: dict[str, dict[str, list[float]]],
           hot: dict[str, list[WrkResult]]) -> str:
    lines = [f"Command: `python loadtests/bench_net.py --creates {args.creates} --rounds "
             f"{args.rounds} --duration {args.duration} --connections {args.connections}`  ",
             f"Machine: {machine_line()}", "",
             "| full create, interleaved (ms) | network step p50 | p99 | launch p50 | p99 | n |",
             "|---|---|---|---|---|---|"]
    for variant in VARIANTS:
        net, launch = cold[variant]["network"], cold[variant]["launch"]
        lines.append(f"| {variant} | {median(net):.1f} | {percentile(net, 99):.1f} | "
                     f"{median(launch):.1f} | {percentile(launch, 99):.1f} | {len(launch)} |")
    added = median(cold[VARIANTS[1]]["network"]) - median(cold[VARIANTS[0]]["network"])
    whole = median(cold[VARIANTS[1]]["network"])
    lines += ["", "| warm, through the edge, wrk -t1 | req/s (median) | p50 ms | p99 ms | "
              "rounds |", "|---|---|---|---|---|"]
    for name, runs in hot.items():
        lines.append(f"| {name} | {median([r.requests_per_s for r in runs]):.0f} | "
                     f"{median([r.p50_ms for r in runs]):.3f} | "
                     f"{median([r.p99_ms for r in runs]):.3f} | {len(runs)} |")
    ratios = [v.requests_per_s / lo.requests_per_s
              for lo, v in zip(hot["loopback"], hot["veth"], strict=True)]
    ratio = median(ratios)
    lines += ["",
              f"- egress rules add {added:+.1f} ms p50 to a full create's network step "
              f"(the step in all: {whole:.1f} ms, beside the runtime's create); a spare's or "
              f"a stopped machine's start has no network step: its link is made when it is "
              f"prepared (target: ≤ 5 ms p50 added by networking on the cold path: "
              f"{'met' if whole <= 5 else 'NOT met for a full create'}; "
              f"met for prepared machines)",
              f"- veth / loopback req/s, warm: {ratio:.3f} (median of paired rounds; target: "
              f"at most 5 % lower, ≥ 0.95: {'met' if ratio >= 0.95 else 'NOT met'})"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--creates", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--connections", type=int, default=50)
    args = parser.parse_args()
    for tool in ("runc", "ip", "nft", "nginx", "wrk"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            sys.exit(f"bench_net needs {tool}")
    work = Path(tempfile.mkdtemp(prefix="thaw-bench-net-"))
    try:
        rootfs = app_rootfs(work, "tiny", {"README": "tinyhttp\n"}, base="builtin:busybox",
                            workdir="/")
        cold = asyncio.run(creates(rootfs, work, args.creates))
        hot = warm(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    body = report(args, cold, hot)
    print(body)
    write_section("net", body)


if __name__ == "__main__":
    main()
