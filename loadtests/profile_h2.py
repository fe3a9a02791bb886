"""Where the edge's HTTP/2 time goes: the edge in this process under cProfile, h2load
driving h2c requests at it, nginx as the machine; prints the top functions.

    .venv/bin/python loadtests/profile_h2.py [--seconds 4] [--top 25]

Needs h2load (nghttp2-client) and nginx. Loopback only; stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.bench_warm import NGINX_BACKEND
from loadtests.benchlib import free_port, process, wait_port


async def run(args: argparse.Namespace, backend: int) -> pstats.Stats:
    from edge.config import EdgeConfig
    from edge.runner import EdgeRuntime
    from ground.appconfig import parse
    from ground.registry.memory import MemoryRegistry
    from ground.registry.types import MachineRecord
    from tests.support.credentials import RING

    registry = MemoryRegistry()
    await registry.put_app(parse({"name": "bench", "image": "x", "auto_stop": "off",
                                  "concurrency": {"soft_limit": 10000, "hard_limit": 10000}}))
    now = time.time()
    await registry.put_machine(MachineRecord(
        id="m1", app="bench", worker="w", region="local", state="started", image_digest="",
        created_at=now, updated_at=now, address=f"127.0.0.1:{backend}"))
    runtime = EdgeRuntime(EdgeConfig(placement_url="http://127.0.0.1:9", port=0,
                                     cluster_keys=RING), registry)
    await runtime.start()
    profiler = cProfile.Profile()
    try:
        load = await asyncio.create_subprocess_exec(
            "h2load", "-c", "10", "-m", "10", "-D", str(args.seconds),
            "-H", ":authority: bench.localhost", f"http://127.0.0.1:{runtime.proxy_port}/",
            stdout=asyncio.subprocess.PIPE)
        profiler.enable()
        out, _ = await load.communicate()
        profiler.disable()
        print(out.decode().split("\n\n")[0][-400:])
    finally:
        await runtime.stop()
    return pstats.Stats(profiler)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="thaw-profile-h2-"))
    backend = free_port()
    (work / "backend.conf").write_text(NGINX_BACKEND.format(dir=work, port=backend))
    with process(["nginx", "-c", str(work / "backend.conf")], cpu=1):
        wait_port(backend)
        stats = asyncio.run(run(args, backend))
    stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
