"""HTTP/2 and TLS: the edge vs nginx as an h2c and an h2-over-TLS reverse proxy to the same
backend, side by side with h2load on loopback; and TLS handshakes per second.

    .venv/bin/python loadtests/bench_h2.py [--rounds 3] [--duration 4] [--no-write]

Topology as bench_warm.py: the proxy under test (nginx with 1 worker, or `thaw
edge` as its own process) on core 0; the backend (nginx answering a fixed 200)
and the load generator on core 1. The edge reads its app from a real Redis.
Both proxies use the same certificate (a local CA's, for bench.localhost) and
keep-alive to the backend. Per round and target: h2load with 10 connections x
10 streams for `--duration` s (saturation), then 1 connection x 1 stream (light
load: the latency a request sees), and `openssl s_time -new` for full TLS
handshakes per second from one client. Rounds interleave the targets; the report
quotes medians over rounds, with p50/p99 from h2load's per-request log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.bench_warm import NGINX_BACKEND, seed_registry
from loadtests.benchlib import free_port, key_file, machine_line, process, wait_port, write_section

NGINX_H2 = """
worker_processes 1; daemon off; pid {dir}/proxy.pid; error_log {dir}/proxy.err;
events {{ worker_connections 4096; }}
http {{ access_log off; keepalive_requests 1000000; http2_max_concurrent_streams 128;
  upstream backend {{ server 127.0.0.1:{backend}; keepalive 64; keepalive_requests 1000000; }}
  server {{ listen 127.0.0.1:{h2c} http2;
    location / {{ proxy_pass http://backend; proxy_http_version 1.1;
                 proxy_set_header Connection ""; proxy_set_header Host $host; }} }}
  server {{ listen 127.0.0.1:{tls} ssl http2; ssl_certificate {cert}; ssl_certificate_key {key};
    ssl_protocols TLSv1.2 TLSv1.3;
    location / {{ proxy_pass http://backend; proxy_http_version 1.1;
                 proxy_set_header Connection ""; proxy_set_header Host $host; }} }} }}
"""
HOST = "bench.localhost"


def h2load(url: str, *, clients: int, streams: int, duration_s: int, log: Path,
           tls: bool, extra: list[str] | None = None) -> tuple[float, float, float, int]:
    """(req/s, p50 ms, p99 ms, failed) of one h2load run, pinned to core 1 (`extra`: more
    of h2load's options, e.g. a body to POST and its headers)."""
    command = ["taskset", "-c", "1", "h2load", "-c", str(clients), "-m", str(streams),
               "-D", str(duration_s), "--warm-up-time", "1", "-H", f":authority: {HOST}",
               *(extra or []), f"--log-file={log}", url]
    out = subprocess.run(command, capture_output=True, text=True, timeout=duration_s + 60).stdout
    rps = float(re.search(r"finished in .*?, ([\d.]+) req/s", out).group(1))  # type: ignore[union-attr]
    failed = int(re.search(r"(\d+) failed", out).group(1))  # type: ignore[union-attr]
    times = sorted(int(line.split("\t")[2]) / 1000.0 for line in log.read_text().splitlines()
                   if line.count("\t") >= 2)
    log.unlink()
    if not times:
        return rps, 0.0, 0.0, failed
    return rps, statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.99))], \
        failed


def handshakes_per_s(port: int, ca: Path, seconds: int) -> float:
    """Full TLS handshakes (no resumption) per second, one client, `openssl s_time -new`."""
    out = subprocess.run(
        ["taskset", "-c", "1", "openssl", "s_time", "-connect", f"127.0.0.1:{port}", "-new",
         "-time", str(seconds), "-CAfile", str(ca)], capture_output=True, text=True,
        timeout=seconds + 30).stdout
    found = re.search(r"([\d.]+) connections/user sec", out)
    connections = re.search(r"(\d+) connections in ([\d.]+)s", out)
    if connections:  # real seconds, not the client's user CPU seconds
        return int(connections.group(1)) / float(connections.group(2))
    return float(found.group(1)) if found else 0.0


def measure(args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    from thaw.localca import LocalCA

    work = Path(tempfile.mkdtemp(prefix="thaw-bench-h2-"))
    ports = {name: free_port() for name in ("backend", "nginx-h2c", "nginx-tls", "edge",
                                            "edge-tls", "admin", "redis")}
    ca = LocalCA(work / "ca")
    chain, key = ca.issue(HOST) or (b"", b"")
    (work / "cert.pem").write_bytes(chain)
    (work / "key.pem").write_bytes(key)
    (work / "backend.conf").write_text(NGINX_BACKEND.format(dir=work, port=ports["backend"]))
    (work / "proxy.conf").write_text(NGINX_H2.format(
        dir=work, backend=ports["backend"], h2c=ports["nginx-h2c"], tls=ports["nginx-tls"],
        cert=work / "cert.pem", key=work / "key.pem"))
    redis_url = f"redis://127.0.0.1:{ports['redis']}/0"
    results: dict[str, dict[str, list[float]]] = {}
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(process(["nginx", "-c", str(work / "backend.conf")], cpu=1))
            stack.enter_context(process(["nginx", "-c", str(work / "proxy.conf")], cpu=0))
            stack.enter_context(process(
                ["redis-server", "--port", str(ports["redis"]), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", str(work)], cpu=1))
            for name in ("backend", "nginx-h2c", "nginx-tls", "redis"):
                wait_port(ports[name])
            asyncio.run(seed_registry(redis_url, ports["backend"]))
            stack.enter_context(process(
                [sys.executable, "-m", "thaw", "edge", "--registry", redis_url,
                 "--port", str(ports["edge"]), "--admin-port", str(ports["admin"]),
                 "--placement", "http://127.0.0.1:9", "--log-level", "warning",
                 "--cluster-key-file", str(key_file(work)),
                 "--tls-cert", str(work / "cert.pem"), "--tls-key", str(work / "key.pem"),
                 "--tls-port", str(ports["edge-tls"])], cpu=0, log=work / "edge.log"))
            wait_port(ports["edge"])
            wait_port(ports["edge-tls"])
            targets = {
                "nginx h2c": (f"http://127.0.0.1:{ports['nginx-h2c']}/", False),
                "edge h2c": (f"http://127.0.0.1:{ports['edge']}/", False),
                "nginx h2 TLS": (f"https://127.0.0.1:{ports['nginx-tls']}/", True),
                "edge h2 TLS": (f"https://127.0.0.1:{ports['edge-tls']}/", True),
            }
            for name in targets:
                results[name] = {"rps": [], "p50": [], "p99": [], "failed": [],
                                 "light_p50": [], "light_p99": [], "handshakes": []}
            for round_no in range(args.rounds):
                for name, (url, tls) in targets.items():
                    row = results[name]
                    rps, p50, p99, failed = h2load(url, clients=10, streams=10,
                                                   duration_s=args.duration,
                                                   log=work / "h2load.log", tls=tls)
                    row["rps"].append(rps)
                    row["p50"].append(p50)
                    row["p99"].append(p99)
                    row["failed"].append(failed)
                    _, lp50, lp99, _ = h2load(url, clients=1, streams=1,
                                              duration_s=args.duration,
                                              log=work / "h2load.log", tls=tls)
                    row["light_p50"].append(lp50)
                    row["light_p99"].append(lp99)
                    if tls:
                        port = int(url.rsplit(":", 1)[1].strip("/"))
                        row["handshakes"].append(handshakes_per_s(port, ca.cert_path,
                                                                  args.duration))
                    print(f"round {round_no + 1} {name:13s} {rps:9.0f} req/s p50 {p50:.2f} "
                          f"p99 {p99:.2f} ms failed {failed}; light p50 {lp50:.3f} "
                          f"p99 {lp99:.3f} ms", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def report(results: dict[str, dict[str, list[float]]], args: argparse.Namespace,
           command: str) -> str:
    med = {name: {k: statistics.median(v) if v else 0.0 for k, v in row.items()}
           for name, row in results.items()}
    lines = ["## HTTP/2 and TLS (`loadtests/bench_h2.py`)", "", f"Command: `{command}`  ",
             f"Machine: {machine_line()}  ",
             f"h2load on loopback, {args.rounds} interleaved rounds of {args.duration} s per "
             "target; proxy on core 0, backend (nginx `return 200`) and h2load on core 1. "
             "Saturation: 10 connections x 10 streams; light load: 1 connection x 1 stream. "
             "Handshakes: `openssl s_time -new` (full handshakes, one client). Medians over "
             "rounds; p50/p99 from h2load's per-request log.", "",
             "| target | req/s (10x10) | p50 ms | p99 ms | failed | light p50 ms | "
             "light p99 ms | TLS handshakes/s |", "|---|---|---|---|---|---|---|---|"]
    for name, row in med.items():
        lines.append(f"| {name} | {row['rps']:.0f} | {row['p50']:.2f} | {row['p99']:.2f} | "
                     f"{row['failed']:.0f} | {row['light_p50']:.3f} | {row['light_p99']:.3f} | "
                     f"{row['handshakes']:.0f} |" if row["handshakes"] else
                     f"| {name} | {row['rps']:.0f} | {row['p50']:.2f} | {row['p99']:.2f} | "
                     f"{row['failed']:.0f} | {row['light_p50']:.3f} | {row['light_p99']:.3f} | "
                     "- |")
    h2c = med["edge h2c"]["rps"] / med["nginx h2c"]["rps"]
    tls = med["edge h2 TLS"]["rps"] / med["nginx h2 TLS"]["rps"]
    lines += ["", f"- edge / nginx, h2c: **{h2c:.2f}** (target ≥ 0.5: "
              f"{'met' if h2c >= 0.5 else 'NOT met'}); h2 over TLS: **{tls:.2f}**",
              f"- TLS added at light load, p50: edge "
              f"{med['edge h2 TLS']['light_p50'] - med['edge h2c']['light_p50']:+.3f} ms, nginx "
              f"{med['nginx h2 TLS']['light_p50'] - med['nginx h2c']['light_p50']:+.3f} ms",
              f"- full TLS handshakes/s: edge {med['edge h2 TLS']['handshakes']:.0f}, nginx "
              f"{med['nginx h2 TLS']['handshakes']:.0f}",
              "- per round req/s: " + "; ".join(
                  f"{name} " + "/".join(f"{v:.0f}" for v in row["rps"])
                  for name, row in results.items())]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=4)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    for tool in ("h2load", "nginx", "openssl", "redis-server", "taskset"):
        if shutil.which(tool) is None:
            raise SystemExit(f"needs {tool} (apt: nghttp2-client nginx-light openssl)")
    results = measure(args)
    command = "python loadtests/bench_h2.py " + " ".join(sys.argv[1:])
    text = report(results, args, command.strip())
    print(text)
    if not args.no_write:
        write_section("h2", text)


if __name__ == "__main__":
    main()
