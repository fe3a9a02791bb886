"""The upstream stall: warm requests through the edge to an app that writes its response
head and body in two sends with Nagle on (Python's http.server as it comes), with and
without the edge's early ACK (`upstream_quickack`), and to examples/hello as fixed.

    python loadtests/bench_stall.py [--requests 200] [--rounds 3] [--no-write]

Each case: one edge (its own process-local runtime on this loop, a memory registry)
in front of one app process; one client sends sequential keep-alive GETs and
times each. Cases alternate within each round. Prints the median and p99 ms
per case and writes them to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
UNFIXED = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = b"hello\\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()  # the head goes out here ...
        self.wfile.write(body)  # ... and the body in a second send
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def start_app(kind: str, port: int) -> subprocess.Popen[bytes]:
    if kind == "unfixed":
        command = [sys.executable, "-c", UNFIXED, str(port)]
        env = dict(os.environ)
    else:
        command = [sys.executable, str(ROOT / "examples/hello/app.py")]
        env = {**os.environ, "PORT": str(port), "THAW_MACHINE_ID": "m1"}
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)


async def wait_port(port: int) -> None:
    for _ in range(500):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.01)
        else:
            writer.close()
            return
    raise SystemExit(f"port {port} never opened")


async def run_case(app_port: int, quickack: bool, requests: int) -> list[float]:
    from edge.config import EdgeConfig
    from edge.runner import EdgeRuntime
    from ground.appconfig import parse
    from ground.registry.memory import MemoryRegistry
    from ground.registry.types import MachineRecord
    from tests.support.credentials import RING

    registry = MemoryRegistry()
    await registry.put_app(parse({"name": "s", "image": "x", "auto_stop": "off"}))
    now = time.time()
    await registry.put_machine(MachineRecord(
        id="m1", app="s", worker="w", region="local", state="started", image_digest="",
        created_at=now, updated_at=now, address=f"127.0.0.1:{app_port}"))
    runtime = EdgeRuntime(EdgeConfig(placement_url="http://127.0.0.1:9", port=0,
                                     cluster_keys=RING, upstream_quickack=quickack), registry)
    await runtime.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", runtime.proxy_port)
        times = []
        for _ in range(requests + 1):
            began = time.perf_counter()
            writer.write(b"GET / HTTP/1.1\r\nHost: s.localhost\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            times.append((time.perf_counter() - began) * 1000)
        writer.close()
        return times[1:]  # the first opens the upstream connection
    finally:
        await runtime.stop()


async def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    from tests.support.ports import free_port

    cases = {"http.server as it comes, early ACK off": ("unfixed", False),
             "http.server as it comes, early ACK on (default)": ("unfixed", True),
             "examples/hello (fixed), early ACK off": ("hello", False),
             "examples/hello (fixed), early ACK on": ("hello", True)}
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, (kind, quickack) in cases.items():
            port = free_port()
            proc = start_app(kind, port)
            try:
                await wait_port(port)
                results[name] += await run_case(port, quickack, args.requests)
            finally:
                proc.terminate()
                proc.wait()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    results = asyncio.run(measure(args))
    from loadtests.benchlib import machine_line, write_section

    command = "python loadtests/bench_stall.py " + " ".join(sys.argv[1:])
    lines = ["## The upstream stall (`loadtests/bench_stall.py`)", "",
             f"Command: `{command.strip()}`  ", f"Machine: {machine_line()}  ",
             f"{args.rounds} rounds of {args.requests} sequential keep-alive GETs per case, "
             "cases alternating; one edge and one app process per case.", "",
             "| app behind the edge | median ms | p99 ms |", "|---|---|---|"]
    for name, values in results.items():
        values.sort()
        p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
        lines.append(f"| {name} | {statistics.median(values):.2f} | {p99:.2f} |")
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("stall", text)


if __name__ == "__main__":
    main()
