"""Warm-path throughput of the edge alone: a tiny keep-alive backend, the edge on one
core (uvloop), wrk driving small GETs. Optionally profiles the edge with cProfile.

    .venv/bin/python loadtests/profile_edge.py [--seconds 10] [--connections 64] [--profile]

Prints wrk's output; with --profile, the top functions by own time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import multiprocessing
import os
import pstats
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.benchlib import BENCH_KEYS

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello"


class Backend(asyncio.Protocol):
    """Answers every request with 'hello' (counts request heads; no body support)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.pending = b""

    def data_received(self, data: bytes) -> None:
        self.pending += data
        count = self.pending.count(b"\r\n\r\n")
        if count:
            self.pending = self.pending[self.pending.rfind(b"\r\n\r\n") + 4:]
            self.transport.write(RESPONSE * count)  # type: ignore[attr-defined]


def run_backend(port: int, cpu: int) -> None:
    import uvloop

    os.sched_setaffinity(0, {cpu})

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Backend, "127.0.0.1", port, backlog=4096)
        await server.serve_forever()

    uvloop.run(main())


def run_edge(port: int, backend_port: int, cpu: int, profile: bool, seconds: float) -> None:
    import uvloop

    from edge.config import EdgeConfig
    from edge.runner import EdgeRuntime
    from ground.appconfig import parse
    from ground.registry.memory import MemoryRegistry
    from ground.registry.types import MachineRecord

    os.sched_setaffinity(0, {cpu})

    async def main() -> None:
        registry = MemoryRegistry()
        await registry.put_app(parse({"name": "bench", "image": "x", "auto_stop": "off",
                                      "concurrency": {"soft_limit": 1000, "hard_limit": 2000}}))
        now = time.time()
        await registry.put_machine(MachineRecord(
            id="m1", app="bench", worker="w", region="local", state="started",
            image_digest="", created_at=now, updated_at=now,
            address=f"127.0.0.1:{backend_port}"))
        runtime = EdgeRuntime(EdgeConfig(placement_url="http://127.0.0.1:9", port=port,
                                         cluster_keys=BENCH_KEYS),
                              registry)
        await runtime.start()
        await asyncio.sleep(seconds + 3)
        await runtime.stop()

    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        uvloop.run(main())
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    else:
        uvloop.run(main())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int) -> None:
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(port)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    backend_port, edge_port = free_port(), free_port()
    backend = multiprocessing.Process(target=run_backend, args=(backend_port, 1), daemon=True)
    backend.start()
    edge = multiprocessing.Process(
        target=run_edge, args=(edge_port, backend_port, 0, args.profile, args.seconds)
    )
    edge.start()
    try:
        wait_port(backend_port)
        wait_port(edge_port)
        for name, port in (("backend direct", backend_port), ("through the edge", edge_port)):
            command = ["taskset", "-c", "1", "wrk", "-t1", f"-c{args.connections}",
                       f"-d{int(args.seconds / 2)}s", "-H", "Host: bench.localhost",
                       f"http://127.0.0.1:{port}/"]
            print(f"== {name}: {' '.join(command)}", flush=True)
            subprocess.run(command, check=True)
    finally:
        edge.join(timeout=args.seconds + 10)
        if edge.is_alive():
            edge.terminate()
        backend.terminate()
        backend.join()


if __name__ == "__main__":
    main()
