"""gRPC unary calls through the edge to an h2c machine, against the same calls made straight
to the machine and through nginx's `grpc_pass`, side by side with h2load on loopback.

    .venv/bin/python loadtests/bench_grpc.py [--rounds 3] [--duration 4] [--no-write]

The machine is a real grpcio server (tests/support/grpc_app.py, `Say`: an echo) on core
1 with h2load; the proxy under test (`thaw edge` as its own process reading its app —
`protocol = "h2c"` — from a real Redis, or nginx with 1 worker) on core 0. Each call is
a POST of one 5-byte gRPC message with `content-type: application/grpc` and `te:
trailers`. Per round and target: h2load with 10 connections x 10 streams for
`--duration` s (saturation), then 1 connection x 1 stream (light load). Rounds
interleave the targets; the report quotes medians over rounds. Before measuring, one
call through each target is checked with a grpcio client (answer and status).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.bench_h2 import h2load
from loadtests.benchlib import (
    free_port,
    key_file,
    machine_line,
    process,
    tree_cpu_s,
    wait_port,
    write_section,
)

HOST = "bench.localhost"
CALL = b"\x00\x00\x00\x00\x05hello"  # one uncompressed gRPC message
NGINX_GRPC = """
worker_processes 1; daemon off; pid {dir}/proxy.pid; error_log {dir}/proxy.err;
events {{ worker_connections 4096; }}
http {{ access_log off; keepalive_requests 1000000; http2_max_concurrent_streams 128;
  upstream machine {{ server 127.0.0.1:{machine}; keepalive 64; }}
  server {{ listen 127.0.0.1:{port} http2;
    location / {{ grpc_pass grpc://machine; }} }} }}
"""


async def seed(url: str, machine_port: int) -> None:
    from ground.appconfig import parse
    from ground.registry.redis import RedisRegistry
    from ground.registry.types import MachineRecord

    registry = RedisRegistry(url)
    await registry.put_app(parse({
        "name": "bench", "image": "bench:latest", "max_machines": 1, "auto_stop": "off",
        "protocol": "h2c",
        "concurrency": {"type": "requests", "soft_limit": 10000, "hard_limit": 10000},
    }))
    now = time.time()
    await registry.put_machine(MachineRecord(
        id="bench-1", app="bench", worker="bench", region="local", state="started",
        image_digest="", created_at=now, updated_at=now, address=f"127.0.0.1:{machine_port}"))
    await registry.close()


def check(port: int) -> None:
    """One call through `port` with a real gRPC client: the echo and an OK status."""
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}",
                               options=[("grpc.default_authority", HOST)]) as chan:
        answer = chan.unary_unary("/thaw.test.Probe/Say")(b"hello", timeout=10)
    if answer != b"echo:hello":
        raise SystemExit(f"port {port} answered {answer!r}")


def measure(args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    work = Path(tempfile.mkdtemp(prefix="thaw-bench-grpc-"))
    ports = {name: free_port() for name in ("machine", "nginx", "edge", "admin", "redis")}
    (work / "proxy.conf").write_text(NGINX_GRPC.format(dir=work, machine=ports["machine"],
                                                       port=ports["nginx"]))
    (work / "call.bin").write_bytes(CALL)
    redis_url = f"redis://127.0.0.1:{ports['redis']}/0"
    root = Path(__file__).resolve().parents[1]
    results: dict[str, dict[str, list[float]]] = {}
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(process([sys.executable, "-m", "tests.support.grpc_app"],
                                        cpu=1, env={"PORT": str(ports["machine"])}, cwd=root))
            nginx = stack.enter_context(process(["nginx", "-c", str(work / "proxy.conf")],
                                                cpu=0))
            stack.enter_context(process(
                ["redis-server", "--port", str(ports["redis"]), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", str(work)], cpu=1))
            for name in ("machine", "nginx", "redis"):
                wait_port(ports[name])
            asyncio.run(seed(redis_url, ports["machine"]))
            edge = stack.enter_context(process(
                [sys.executable, "-m", "thaw", "edge", "--registry", redis_url,
                 "--port", str(ports["edge"]), "--admin-port", str(ports["admin"]),
                 "--placement", "http://127.0.0.1:9", "--log-level", "warning",
                 "--cluster-key-file", str(key_file(work))], cpu=0, log=work / "edge.log"))
            wait_port(ports["edge"])
            targets = {"direct": ports["machine"], "nginx grpc_pass": ports["nginx"],
                       "edge": ports["edge"]}
            for port in targets.values():
                check(port)
            extra = ["-d", str(work / "call.bin"), "-H", "content-type: application/grpc",
                     "-H", "te: trailers"]
            pids = {"nginx grpc_pass": nginx.pid, "edge": edge.pid}
            for name in targets:
                results[name] = {"rps": [], "p50": [], "p99": [], "failed": [],
                                 "light_p50": [], "light_p99": [], "cpu_us": []}
            for round_no in range(args.rounds):
                for name, port in targets.items():
                    row = results[name]
                    url = f"http://127.0.0.1:{port}/thaw.test.Probe/Say"
                    pid = pids.get(name)
                    cpu_before = tree_cpu_s(pid) if pid else 0.0
                    rps, p50, p99, failed = h2load(url, clients=10, streams=10,
                                                   duration_s=args.duration,
                                                   log=work / "h2load.log", tls=False,
                                                   extra=extra)
                    # the proxy's CPU per call at saturation (user + system, its workers'
                    # included), over h2load's whole run (connection set-up included)
                    cpu_us = ((tree_cpu_s(pid) - cpu_before) * 1e6 / (rps * args.duration)
                              if pid and rps else 0.0)
                    _, lp50, lp99, _ = h2load(url, clients=1, streams=1,
                                              duration_s=args.duration,
                                              log=work / "h2load.log", tls=False, extra=extra)
                    for key, value in (("rps", rps), ("p50", p50), ("p99", p99),
                                       ("failed", failed), ("light_p50", lp50),
                                       ("light_p99", lp99), ("cpu_us", cpu_us)):
                        row[key].append(value)
                    print(f"round {round_no + 1} {name:16s} {rps:8.0f} calls/s p50 {p50:.2f} "
                          f"p99 {p99:.2f} ms failed {failed}; light p50 {lp50:.3f} "
                          f"p99 {lp99:.3f} ms; proxy CPU {cpu_us:.0f} us/call", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def report(results: dict[str, dict[str, list[float]]], args: argparse.Namespace,
           command: str) -> str:
    med = {name: {k: statistics.median(v) for k, v in row.items()}
           for name, row in results.items()}
    lines = ["## gRPC through the edge (`loadtests/bench_grpc.py`, issue 28)", "",
             f"Command: `{command}`  ", f"Machine: {machine_line()}  ",
             f"h2load on loopback, {args.rounds} interleaved rounds of {args.duration} s per "
             "target: unary calls (a 5-byte message) to a grpcio server (`Say`) on core 1 "
             "with h2load; the proxy on core 0. Saturation: 10 connections x 10 streams; "
             "light: 1 x 1. Medians over rounds.", "",
             "| target | calls/s (10x10) | p50 ms | p99 ms | failed | light p50 ms | "
             "light p99 ms | proxy CPU µs per call (10x10) |", "|---|---|---|---|---|---|---|---|"]
    for name, row in med.items():
        cpu = f"{row['cpu_us']:.0f}" if row["cpu_us"] else "—"
        lines.append(f"| {name} | {row['rps']:.0f} | {row['p50']:.2f} | {row['p99']:.2f} | "
                     f"{row['failed']:.0f} | {row['light_p50']:.3f} | "
                     f"{row['light_p99']:.3f} | {cpu} |")
    lines += ["", f"- edge / direct: **{med['edge']['rps'] / med['direct']['rps']:.2f}**; "
              f"edge / nginx grpc_pass: "
              f"**{med['edge']['rps'] / med['nginx grpc_pass']['rps']:.2f}**",
              f"- proxy CPU per call, edge / nginx grpc_pass: "
              f"**{med['edge']['cpu_us'] / med['nginx grpc_pass']['cpu_us']:.2f}**",
              f"- light load p50 added: edge "
              f"{med['edge']['light_p50'] - med['direct']['light_p50']:+.3f} ms, nginx "
              f"{med['nginx grpc_pass']['light_p50'] - med['direct']['light_p50']:+.3f} ms",
              "- per round calls/s: " + "; ".join(
                  f"{name} " + "/".join(f"{v:.0f}" for v in row["rps"])
                  for name, row in results.items())]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=4)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    for tool in ("h2load", "nginx", "redis-server", "taskset"):
        if shutil.which(tool) is None:
            raise SystemExit(f"needs {tool} (apt: nghttp2-client nginx-light)")
    results = measure(args)
    command = "python loadtests/bench_grpc.py " + " ".join(sys.argv[1:])
    text = report(results, args, command.strip())
    print(text)
    if not args.no_write:
        write_section("grpc", text)


if __name__ == "__main__":
    main()
