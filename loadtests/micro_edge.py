"""The edge's per-request Python cost, with no sockets: µs per proxied request.

    taskset -c 0 .venv/bin/python loadtests/micro_edge.py [--rounds 3] [--repeat 9] [--no-write]

Drives the real `ClientConnection` and `UpstreamConnection` of the edge (and, for
comparison, `floor_proxy.py`'s protocols) with in-memory transports: a request
is fed to the client side, the bytes the edge writes upstream are checked, a
response is fed to the upstream side, and the bytes written to the client are
checked. What is left is the Python the edge runs per request — the part of
the warm path this code controls — without the kernel, the event loop's
polling, or the run-to-run noise of wrk on a shared VM. The floor and the edge
alternate within a process; the native edge (this process, when `make native`
built it) and the pure-Python edge (a child with `THAW_NATIVE=0`) alternate
`--rounds` times. Prints the median and best µs per request of each and
writes them to docs/benchmarks.md. `--profile` adds cProfile's top functions.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


REQUEST = (b"GET /some/path?q=1 HTTP/1.1\r\nHost: bench.localhost\r\n"
           b"User-Agent: wrk\r\nAccept: */*\r\n\r\n")
# nginx's own answer to `return 200 "ok\n"`: the backend of bench_warm.py
RESPONSE = (b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Sun, 22 Nov 2026 10:00:00 GMT\r\n"
            b"Content-Type: application/octet-stream\r\nContent-Length: 3\r\n"
            b"Connection: keep-alive\r\n\r\nok\n")


class MemoryTransport:
    """Just enough of asyncio.Transport for the protocols: writes are kept, not sent."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def writelines(self, parts: list[bytes]) -> None:
        self.out.append(b"".join(parts))

    def take(self) -> bytes:
        data = b"".join(self.out)
        self.out.clear()
        return data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True


def edge_config(**extra: object) -> Any:
    """The edge's config here; ab_micro.py also runs this file in revisions from before
    the cluster key existed, so the key is given only where the config has one."""
    from edge.config import EdgeConfig

    if "cluster_keys" not in EdgeConfig.__dataclass_fields__:
        return EdgeConfig(placement_url="http://127.0.0.1:9", **extra)  # type: ignore[arg-type]
    from ground.auth.signing import KeyRing

    keys = KeyRing.parse("micro-edge-key-" + "m" * 32)  # no placement answers anyway
    return EdgeConfig(placement_url="http://127.0.0.1:9", cluster_keys=keys,
                      **extra)  # type: ignore[arg-type]


async def edge_pair(**config: object) -> tuple[Any, Any, MemoryTransport, MemoryTransport]:
    """An edge serving app `bench` from one machine, with one pooled upstream connection
    (`config`: more of the edge's config, e.g. an access log)."""
    from edge.service import Edge

    try:  # the layout since the edge's adapters moved (ab_micro.py runs older trees too)
        from edge.adapters.http1 import ClientConnection
        from edge.adapters.upstream import UpstreamConnection
    except ImportError:
        from edge.client import ClientConnection  # type: ignore[no-redef]
        from edge.upstream import UpstreamConnection  # type: ignore[no-redef]
    from edge.view import View
    from ground.appconfig import parse

    loop = asyncio.get_running_loop()
    view = View("localhost", loop.time)
    view.set_app("bench", parse({"name": "bench", "image": "x", "auto_stop": "off",
                                 "concurrency": {"soft_limit": 1000, "hard_limit": 2000}}))
    view.add_started("bench", "m1", "127.0.0.1:9999")
    edge = Edge(edge_config(**config), view)
    client = ClientConnection(edge)
    client_tx = MemoryTransport()
    client.connection_made(client_tx)  # type: ignore[arg-type]
    slot = view.apps["bench"].machines["m1"]  # its pool key: the machine's (id@address)
    upstream = UpstreamConnection(edge.pool, getattr(slot, "pool_key", slot.address))
    upstream_tx = MemoryTransport()
    upstream.connection_made(upstream_tx)  # type: ignore[arg-type]
    edge.pool.release(upstream, True)
    return client, upstream, client_tx, upstream_tx


async def floor_pair() -> tuple[Any, Any, MemoryTransport, MemoryTransport]:
    from loadtests.floor_proxy import Client, Upstream

    client = Client(("127.0.0.1", 9999))
    client_tx = MemoryTransport()
    client.connection_made(client_tx)  # type: ignore[arg-type]
    upstream = Upstream(client)
    upstream_tx = MemoryTransport()
    upstream.connection_made(upstream_tx)  # type: ignore[arg-type]
    client.upstream = upstream
    return client, upstream, client_tx, upstream_tx


def check_once(client: Any, upstream: Any, client_tx: MemoryTransport,
               upstream_tx: MemoryTransport) -> None:
    """One request through, its bytes checked: the timing below measures a working proxy."""
    client.data_received(REQUEST)
    sent = upstream_tx.take()
    if not sent.startswith(b"GET /some/path?q=1 HTTP/1.1\r\n") or b"\r\n\r\n" not in sent:
        raise SystemExit(f"the proxy sent upstream: {sent!r}")
    upstream.data_received(RESPONSE)
    answer = client_tx.take()
    if not answer.startswith(b"HTTP/1.1 200 OK\r\n") or not answer.endswith(b"\r\n\r\nok\n"):
        raise SystemExit(f"the proxy answered: {answer!r}")


def run(pair: Any, requests: int) -> float:
    client, upstream, client_tx, upstream_tx = pair
    check_once(*pair)
    feed_client, feed_upstream = client.data_received, upstream.data_received
    up_out, client_out = upstream_tx.out, client_tx.out
    started = time.perf_counter()
    for _ in range(requests):
        feed_client(REQUEST)
        feed_upstream(RESPONSE)
        up_out.clear()
        client_out.clear()
    if getattr(getattr(client, "shell", None), "turn_ends", False):
        # the edge queued the end of a loop turn (its client's share of each turn, kept
        # for clients of several connections), which this loop never runs
        raise SystemExit("the edge kept a turn share for one connection: requests would "
                         "wait for a turn this harness never ends")
    return (time.perf_counter() - started) / requests * 1e6


async def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    """µs per request of the floor and of the edge as imported here, runs interleaved."""
    pairs = {"floor": await floor_pair(), "edge": await edge_pair()}
    timings: dict[str, list[float]] = {name: [] for name in pairs}
    for _ in range(args.repeat):  # interleaved, so drifts in machine speed hit both alike
        for name, pair in pairs.items():
            timings[name].append(run(pair, args.requests))
    if args.profile:
        pair = await edge_pair()
        profiler = cProfile.Profile()
        profiler.enable()
        run(pair, args.requests)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    return timings


def pure_child(args: argparse.Namespace) -> dict[str, list[float]]:
    """The same measurement in a child process running the edge's modules as Python."""
    command = [sys.executable, __file__, "--json", "--requests", str(args.requests),
               "--repeat", str(args.repeat)]
    out = subprocess.run(command, env={**os.environ, "THAW_NATIVE": "0"}, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)  # type: ignore[no-any-return]


def report(rows: dict[str, list[float]], args: argparse.Namespace, command: str) -> str:
    from loadtests.benchlib import machine_line

    lines = ["## The edge's Python per request (`loadtests/micro_edge.py`)", "",
             f"Command: `{command}`  ", f"Machine: {machine_line()}  ",
             f"CPUs allowed: {sorted(os.sched_getaffinity(0))}; "
             f"{args.rounds} alternations of {args.repeat} runs of {args.requests} requests "
             "each (native in this process, pure Python in a child with `THAW_NATIVE=0`); "
             "the edge's protocols driven with in-memory transports, no sockets. Lower is "
             "better.", "", "| what | median µs/request | best µs/request | runs |",
             "|---|---|---|---|"]
    for name, values in rows.items():
        lines.append(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | "
                     f"{len(values)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=3, help="native/pure alternations")
    parser.add_argument("--profile", action="store_true", help="cProfile the edge too")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    import uvloop

    if args.json:  # (also run inside older trees by ab_micro.py: no ground.native there)
        print(json.dumps(uvloop.run(measure(args))))
        return
    from ground.native import state

    here = "edge, native (mypyc)" if state()[0] else f"edge, pure Python ({state()[1]})"
    rows: dict[str, list[float]] = {"floor": [], here: [], "edge, pure Python": []}
    for _ in range(args.rounds):
        native = uvloop.run(measure(args))
        rows["floor"] += native["floor"]
        rows[here] += native["edge"]
        pure = pure_child(args)
        rows["floor"] += pure["floor"]
        rows["edge, pure Python"] += pure["edge"]
    if not state()[0]:
        del rows[here]
    command = "python loadtests/micro_edge.py " + " ".join(sys.argv[1:])
    text = report(rows, args, command.strip())
    print(text)
    if not args.no_write:
        from loadtests.benchlib import write_section

        write_section("micro", text)


if __name__ == "__main__":
    main()
