"""Memory of the edge per idle HTTP/1.1 connection, and where it goes (issue 28).

    .venv/bin/python loadtests/mem_conns.py [--conns 2000]

An edge (the native build when it matches, in this process, tracemalloc on) serves one
warm app; a child process opens `--conns` connections to it and holds them idle: first
connected only, then after one request each (keep-alive). For each state the edge's
Python allocations (tracemalloc, by line) and its RSS are compared with before, divided
by the connections. Kernel socket buffers are not in either figure. Each state is read
twice: 1 s after it began, and once every connection was idle a watchdog period and
parked (edge/core/parking.py: its parser, head reader and timer given up).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import textwrap
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HOLDER = textwrap.dedent("""
    import socket, sys
    port, count = int(sys.argv[1]), int(sys.argv[2])
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
    print("connected", flush=True)
    sys.stdin.readline()
    for c in conns:  # one after another: the edge's one pooled machine connection serves all
        c.sendall(b"GET / HTTP/1.1\\r\\nHost: web.localhost\\r\\n\\r\\n")
        data = b""
        while b"\\r\\n\\r\\n" not in data or not data.endswith(b"hello"):
            chunk = c.recv(65536)
            if not chunk:
                break
            data += chunk
            if b"\\r\\n\\r\\n" in data:
                head, _, body = data.partition(b"\\r\\n\\r\\n")
                length = [int(l.split(b":")[1]) for l in head.split(b"\\r\\n")
                          if l.lower().startswith(b"content-length:")]
                if length and len(body) >= length[0]:
                    break
    print("answered", flush=True)
    sys.stdin.readline()
""")


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0.05)


async def parked(edge: Any, count: int) -> None:
    """Until every held connection has been idle a watchdog period and is parked (an
    edge from before parking: 6 s, two of its watchdog periods)."""
    if not hasattr(edge.shell, "parking"):
        await asyncio.sleep(6)
        return
    for _ in range(400):
        if len(edge.shell.parking) >= count:
            return
        await asyncio.sleep(0.05)
    raise SystemExit(f"only {len(edge.shell.parking)} of {count} connections parked")


def report(label: str, before: tracemalloc.Snapshot, rss_before: int, count: int,
           top: int) -> None:
    after = tracemalloc.take_snapshot()
    stats = after.compare_to(before, "lineno")
    total = sum(s.size_diff for s in stats)
    print(f"\n{label}: {total / count:,.0f} B per connection in Python allocations, "
          f"RSS {(rss_kb() - rss_before) * 1024 / count:,.0f} B per connection")
    for stat in stats[:top]:
        if stat.size_diff <= 0:
            break
        frame = stat.traceback[0]
        print(f"  {stat.size_diff / count:8,.0f} B  {stat.count_diff / count:5.2f} blocks  "
              f"{frame.filename.split('/work/main/')[-1]}:{frame.lineno}")


async def main(count: int, top: int) -> None:
    from tests.support.edge_fakes import start_warm_edge

    edge = await start_warm_edge(max_conns_per_client=1_000_000, new_conns_per_s=1_000_000,
                                 new_conns_burst=1_000_000)
    holder = None
    try:
        await settle()
        tracemalloc.start(1)
        before, rss_before = tracemalloc.take_snapshot(), rss_kb()
        holder = await asyncio.create_subprocess_exec(
            sys.executable, "-c", HOLDER, str(edge.port), str(count),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        assert holder.stdin is not None and holder.stdout is not None
        line = await holder.stdout.readline()
        assert line.strip() == b"connected", line
        await settle()
        report("connected, nothing sent", before, rss_before, count, top)
        await parked(edge, count)
        report("connected, nothing sent, parked (idle a watchdog period)", before,
               rss_before, count, top)
        holder.stdin.write(b"\n")
        await holder.stdin.drain()
        line = await holder.stdout.readline()
        assert line.strip() == b"answered", line
        await settle()
        report("after one request each (idle keep-alive), 1 s later", before, rss_before,
               count, top)
        await parked(edge, count)
        report("after one request each, parked (idle a watchdog period)", before, rss_before,
               count, top)
    finally:
        if holder is not None:
            holder.kill()
            await holder.wait()
        await edge.close()

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conns", type=int, default=2000)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    import uvloop

    uvloop.run(main(args.conns, args.top))
