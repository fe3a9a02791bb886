"""What an idle edge costs: instructions per second of `thaw edge` with nothing to do
(callgrind, so the figure does not depend on the machine's load).

    python loadtests/instr_idle.py [--apps 100] [--seconds 20] [--warmup 20] [--edge-args ...]
                                   [--workers N]

It starts a Redis of its own, puts `--apps` apps with one started machine each into it
(default settings: auto-stop after 300 s idle, so every pass looks and none stops),
starts `thaw edge` under `valgrind --tool=callgrind --instr-atstart=no` on that registry
(placement named but never called: nothing to wake or stop), waits `--warmup` seconds
(start-up under valgrind is slow), switches instrumentation on and zeroes the counts
(`callgrind_control -i on`, `-z`), waits `--seconds` with no request, dumps (`-d`), and
prints the instructions per second and the functions that took most (inclusive; with
`--self`, by their own instructions: the compiled edge's functions by name). The
edge's loops (the registry's feed, the load share with other edges, auto-stop, the
view's resync) are all that runs. As on a real platform: `--workers N` has N workers
heartbeat into the registry once a second meanwhile (each heartbeat is a change in the
feed every edge follows). Placements are not discovered (that needs a route key, and
the machines seeded here are not signed with one): on a platform, one more read-only
script every 5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.benchlib import key_file, process, wait_port
from tests.support.ports import free_ports


async def seed(redis_url: str, apps: int) -> None:
    from ground.appconfig import parse
    from ground.registry.redis import RedisRegistry
    from ground.registry.types import MachineRecord

    registry = RedisRegistry(redis_url)
    now = time.time()
    for i in range(apps):
        await registry.put_app(parse({"name": f"app{i}", "image": "bench:latest"}))
        await registry.put_machine(MachineRecord(
            id=f"m{i}", app=f"app{i}", worker="w-bench", region="local", state="started",
            image_digest="", created_at=now, updated_at=now, address="127.0.0.1:9"))
    await registry.close()


@contextlib.contextmanager
def seeded_redis(work: Path, apps: int) -> Iterator[str]:
    """A Redis of the script's own holding `apps` apps with a started machine each: its
    URL, while it runs."""
    port = free_ports(1)[0]
    url = f"redis://127.0.0.1:{port}/0"
    with process(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                  "--appendonly", "no", "--dir", str(work)], log=work / "redis.log"):
        wait_port(port)
        asyncio.run(seed(url, apps))
        yield url


def edge_argv(redis_url: str, work: Path) -> tuple[list[str], int]:
    """`thaw edge` on that registry (placement named but never called, not discovered),
    and the port it serves on."""
    edge_port, admin_port = free_ports(2)
    return [sys.executable, "-m", "thaw", "edge", "--registry", redis_url,
            "--port", str(edge_port), "--admin-port", str(admin_port),
            "--placement", "http://127.0.0.1:9", "--no-discover-placements",
            "--log-level", "warning", "--cluster-key-file", str(key_file(work))], edge_port


def heartbeats(redis_url: str, workers: int, stop: threading.Event) -> None:
    """`workers` workers' heartbeats, one a second each, until `stop` (in a thread)."""
    from ground.registry.redis import RedisRegistry
    from ground.registry.types import WorkerStatus

    async def beat() -> None:
        registry = RedisRegistry(redis_url)
        while not stop.is_set():
            for n in range(workers):
                await registry.publish_worker(WorkerStatus(
                    id=f"w{n}", epoch=1, region="local", url=f"http://127.0.0.1:{9 + n}",
                    cpus=4, memory_mb=4096, updated_at=time.time()), ttl_s=3)
            await asyncio.sleep(1)
        await registry.close()

    asyncio.run(beat())


def total(dump: Path) -> int:
    for line in dump.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {dump}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--apps", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--edge-args", default="")
    parser.add_argument("--workers", type=int, default=0,
                        help="workers heartbeating into the registry meanwhile")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--self", action="store_true",
                        help="list functions by their own instructions, not inclusive")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="instr-idle-") as tmp:
        work = Path(tmp)
        with seeded_redis(work, args.apps) as redis_url:
            dump = work / "callgrind.out"
            argv, edge_port = edge_argv(redis_url, work)
            with process(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                          f"--callgrind-out-file={dump}", *argv,
                          *shlex.split(args.edge_args)],
                         log=work / "edge.log") as edge:
                wait_port(edge_port, timeout_s=300)
                stop = threading.Event()
                beating = threading.Thread(target=heartbeats,
                                           args=(redis_url, args.workers, stop), daemon=True)
                if args.workers:
                    beating.start()
                time.sleep(args.warmup)
                for flag in ("-i", "on"), ("-z",):
                    subprocess.run(["callgrind_control", *flag, str(edge.pid)], check=True,
                                   stdout=subprocess.DEVNULL)
                began = time.monotonic()
                time.sleep(args.seconds)
                subprocess.run(["callgrind_control", "-d", str(edge.pid)], check=True,
                               stdout=subprocess.DEVNULL)
                window = time.monotonic() - began
                stop.set()
                if args.workers:
                    beating.join(timeout=5)
                dumps = sorted(work.glob("callgrind.out*"), key=lambda p: p.stat().st_mtime)
                counted = total(dumps[-1])
                print(f"idle edge, {args.apps} apps with a machine each, Redis registry, "
                      f"{args.workers} workers heartbeating: "
                      f"{counted:,} instructions in {window:.1f} s = "
                      f"{counted / window:,.0f} instructions/s")
                annotate = subprocess.run(
                    ["callgrind_annotate", f"--inclusive={'no' if args.self else 'yes'}",
                     str(dumps[-1])],
                    capture_output=True, text=True)
                lines = [ln for ln in annotate.stdout.splitlines() if "(" in ln or ":" in ln]
                print("\n".join(lines[:args.top + 12]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
