"""The shared view with many apps: what one change and one full resync cost when 10,000
apps are configured, against 10 apps, in the same run (cases interleaved).

    python loadtests/bench_manyapps.py [--apps 10000] [--rounds 3] [--no-write]

Figures (loopback only; a redis-server of its own on a free port, killed by PID):

- feed: one write followed by its arrival at a reader of `changes()`, µs per change
  (memory and Redis backends), and `feed_position()` on Redis;
- edge refresh: `RegistryFeed.refresh("app", name)` on a view holding every app, µs;
- resync: `RegistryFeed.load()` into a loaded `View` against Redis (every app has a
  host; one app in four has two started machines), its wall time and the longest gap
  between two turns of the event loop meanwhile (a `sleep(0)` ticker);
- warm: sequential keep-alive GETs from a client thread through a real edge
  (`EdgeRuntime` on this loop, Redis registry, examples/hello behind it), p50/p99/max
  ms while the edge resyncs back to back and while it does not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edge.adapters.registry_feed import RegistryFeed  # noqa: E402
from edge.view import View  # noqa: E402
from ground.appconfig import AppConfig, parse  # noqa: E402
from ground.registry import MachineRecord, Registry  # noqa: E402
from ground.registry.memory import MemoryRegistry  # noqa: E402
from ground.registry.redis import RedisRegistry  # noqa: E402

FEED_WRITES = 500
REFRESHES = 200


def config(i: int) -> AppConfig:
    return parse({"name": f"app{i:05d}", "image": "img", "hosts": [f"www.app{i:05d}.test"],
                  "auto_stop": "off"})


def started(app: str, mid: str, address: str = "127.0.0.1:9") -> MachineRecord:
    now = time.time()
    return MachineRecord(id=mid, app=app, worker="w1", region="local", state="started",
                         image_digest="", created_at=now, updated_at=now, address=address)


async def fill(registry: Registry, apps: int) -> None:
    """`apps` apps, each with a host; one app in four with two started machines."""
    for start in range(0, apps, 50):
        batch = range(start, min(apps, start + 50))
        await asyncio.gather(*(registry.put_app(config(i)) for i in batch))
        await asyncio.gather(*(registry.put_machine(started(f"app{i:05d}", f"m{i}-{k}"))
                               for i in batch if i % 4 == 0 for k in range(2)))


async def feed_cost_us(registry: Registry, writes: int) -> float:
    """Mean µs from a write to its arrival at a reader following the feed."""
    feed = registry.changes(after=await registry.feed_position())
    began = time.perf_counter()
    for n in range(writes):
        await registry.put_machine(started("probe", f"p{n % 50}"))
        await feed.__anext__()
    spent = time.perf_counter() - began
    await feed.aclose()  # type: ignore[attr-defined]
    return spent / writes * 1e6


async def mean_us(call: Callable[[], Awaitable[object]], times: int) -> float:
    began = time.perf_counter()
    for _ in range(times):
        await call()
    return (time.perf_counter() - began) / times * 1e6


class LoopGaps:
    """The longest gap between two turns of the loop while it runs, ms: on the wall clock
    (what a request waits, including time the OS gave other processes) and in this
    thread's CPU time (what the loop itself spent; steady on a busy machine)."""

    def __init__(self) -> None:
        self.longest_ms = 0.0
        self.longest_cpu_ms = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last, last_cpu = time.perf_counter(), time.thread_time()
        while True:
            await asyncio.sleep(0)
            now, now_cpu = time.perf_counter(), time.thread_time()
            self.longest_ms = max(self.longest_ms, (now - last) * 1000)
            self.longest_cpu_ms = max(self.longest_cpu_ms, (now_cpu - last_cpu) * 1000)
            last, last_cpu = now, now_cpu

    def __enter__(self) -> LoopGaps:
        self._task = asyncio.ensure_future(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def resync_figures(registry: Registry,
                         rounds: int) -> tuple[float, float, float, float, float]:
    """(first load s, median resync s and its CPU s, longest loop gap during resyncs ms,
    on the wall clock and in CPU time)."""
    view = View("localhost", clock=asyncio.get_running_loop().time)
    feed = RegistryFeed(view, registry, resync_interval_s=3600)
    began = time.perf_counter()
    await feed.load()
    first = time.perf_counter() - began
    spans, cpu = [], []
    with LoopGaps() as gaps:
        for _ in range(rounds):
            began, began_cpu = time.perf_counter(), time.thread_time()
            await feed.load()
            spans.append(time.perf_counter() - began)
            cpu.append(time.thread_time() - began_cpu)
    return (first, statistics.median(spans), statistics.median(cpu), gaps.longest_ms,
            gaps.longest_cpu_ms)


async def refresh_cost_us(registry: Registry, apps: int) -> float:
    view = View("localhost", clock=asyncio.get_running_loop().time)
    feed = RegistryFeed(view, registry, resync_interval_s=3600)
    await feed.load()
    names = [f"app{i:05d}" for i in range(0, apps, max(1, apps // REFRESHES))]
    began = time.perf_counter()
    for name in names:
        await feed.refresh("app", name)
    return (time.perf_counter() - began) / len(names) * 1e6


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def client(port: int, seconds: float, out: list[float]) -> None:
    """Sequential keep-alive GETs to the edge for `seconds`, from a thread (its own clock)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = sock.makefile("rb")
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        began = time.perf_counter()
        sock.sendall(b"GET / HTTP/1.1\r\nHost: warm.localhost\r\n\r\n")
        length = 0
        while (line := reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        reader.read(length)
        out.append((time.perf_counter() - began) * 1000)
    sock.close()


async def warm_figures(url: str, app_port: int, rounds: int,
                       seconds: float) -> dict[str, list[float]]:
    from edge.config import EdgeConfig
    from edge.runner import EdgeRuntime
    from tests.support.credentials import RING

    registry = RedisRegistry(url)
    await registry.put_app(parse({"name": "warm", "image": "x", "auto_stop": "off"}))
    await registry.put_machine(started("warm", "m1", f"127.0.0.1:{app_port}"))
    runtime = EdgeRuntime(EdgeConfig(placement_url="http://127.0.0.1:9", port=0,
                                     cluster_keys=RING, resync_interval_s=3600), registry)
    await runtime.start()
    feed = runtime._feed  # the bench drives the resync itself
    assert feed is not None
    times: dict[str, list[float]] = {"idle": [], "resyncing": []}
    try:
        for _ in range(rounds):
            for case in times:
                out: list[float] = []
                thread = threading.Thread(target=client,
                                          args=(runtime.proxy_port, seconds, out))
                thread.start()
                while thread.is_alive():
                    if case == "resyncing":
                        await feed.load()
                    else:
                        await asyncio.sleep(0.01)
                thread.join()
                times[case] += out[1:]
    finally:
        await runtime.stop()
        await registry.close()
    return times


def start_hello(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(ROOT / "examples/hello/app.py")],
                            env={**os.environ, "PORT": str(port), "THAW_MACHINE_ID": "m1"},
                            stdout=subprocess.DEVNULL)


async def measure(args: argparse.Namespace) -> list[str]:
    from tests.support.ports import free_port
    from tests.support.redis_server import start_redis_server

    sizes = [10, args.apps]
    rows: dict[str, dict[int, list[float]]] = {}

    def note(name: str, size: int, value: float) -> None:
        rows.setdefault(name, {s: [] for s in sizes})[size].append(value)

    with start_redis_server() as server:
        redis = {n: RedisRegistry(server.url[:-1] + str(db)) for db, n in enumerate(sizes)}
        memory = {n: MemoryRegistry() for n in sizes}
        for n in sizes:
            await fill(redis[n], n)
            await fill(memory[n], n)
        for _ in range(args.rounds):
            for n in sizes:
                note("feed, memory: one change (µs)", n, await feed_cost_us(memory[n],
                                                                          FEED_WRITES))
                note("feed, Redis: one change (µs)", n, await feed_cost_us(redis[n],
                                                                         FEED_WRITES))
                note("feed, Redis: feed_position (µs)", n,
                     await mean_us(redis[n].feed_position, FEED_WRITES))
                note("edge: refresh of one app (µs)", n, await refresh_cost_us(memory[n], n))
                first, resync, cpu, gap, gap_cpu = await resync_figures(redis[n], 3)
                note("edge: first load from Redis (ms)", n, first * 1000)
                note("edge: resync from Redis (ms)", n, resync * 1000)
                note("edge: resync, the edge's CPU (ms)", n, cpu * 1000)
                note("edge: longest loop gap during resyncs, wall (ms)", n, gap)
                note("edge: longest loop gap during resyncs, CPU (ms)", n, gap_cpu)
                print(f"  round figures for {n} apps done", flush=True)
        app_port = free_port()
        app = start_hello(app_port)
        try:
            warm = await warm_figures(server.url[:-1] + str(sizes.index(args.apps)), app_port,
                                      args.rounds, args.warm_s)
        finally:
            app.terminate()
            app.wait()
        for registry in redis.values():
            await registry.close()
    lines = [f"| {name} | {statistics.median(by[sizes[0]]):.1f} | "
             f"{statistics.median(by[sizes[1]]):.1f} |" for name, by in rows.items()]
    lines.append("")
    lines.append(f"Warm GETs through a real edge with {args.apps} apps in its view "
                 f"({args.rounds} x {args.warm_s:.0f} s per case, alternating):")
    lines.append("")
    lines += ["| while the edge | requests | p50 ms | p99 ms | max ms |", "|---|---|---|---|---|"]
    for case, values in warm.items():
        lines.append(f"| {case} | {len(values)} | {statistics.median(values):.2f} | "
                     f"{percentile(values, 0.99):.2f} | {max(values):.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--apps", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm-s", type=float, default=4.0)
    parser.add_argument("--label", default="", help="a heading suffix, e.g. 'before'")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    began = time.perf_counter()
    rows = asyncio.run(measure(args))
    from loadtests.benchlib import machine_line, write_section

    command = "python loadtests/bench_manyapps.py " + " ".join(sys.argv[1:])
    native = "on"
    with contextlib.suppress(Exception):
        from ground.native import state
        native = "on" if state()[0] else "off"
    lines = [f"## Many apps: the feed and the resync (`loadtests/bench_manyapps.py`)"
             f"{' — ' + args.label if args.label else ''}", "",
             f"Command: `{command.strip()}`  ", f"Machine: {machine_line()}  ",
             f"Native edge: {native}; {time.perf_counter() - began:.0f} s in all; medians of "
             f"{args.rounds} rounds, the two sizes alternating.", "",
             f"| figure | 10 apps | {args.apps} apps |", "|---|---|---|", *rows]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("manyapps", text)


if __name__ == "__main__":
    main()
