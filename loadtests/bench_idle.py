"""What idle costs: CPU of each placement and edge process while N apps sit with no
machines and no traffic, at 2,000 and 10,000 apps.

    python loadtests/bench_idle.py [--apps 2000 10000] [--placements 1 2]
                                   [--settle-s 150] [--window-s 30]

For each (apps, placements) case: a redis-server of its own, the apps written straight
into the store (SQLite for one placement; a PostgreSQL of its own, shared, for two),
then the placements and one edge started as separate processes (tests/support/
services.py, no agent: no machines). After the placements answer and `--settle-s`
more (the first pass over every app at start, and the quiet apps' leases given
back 30 s later: with two placements on PostgreSQL at 10,000 apps under load this
took more than 60 s), each process's CPU (utime +
stime from /proc/PID/stat) is read over `--window-s` and printed as % of one core.
Everything started is stopped by PID; the temp dirs are removed.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

from ground.appconfig import parse  # noqa: E402
from loadtests.benchlib import cpu_s  # noqa: E402
from placement.api import Release  # noqa: E402
from placement.store import open_store  # noqa: E402
from tests.support.postgres import PostgresServer  # noqa: E402
from tests.support.redis_server import start_redis_server  # noqa: E402
from tests.support.services import Services  # noqa: E402

DIGEST = "sha256:" + "0" * 64


async def fill(url: str, state_dir: Path, apps: int) -> None:
    """`apps` apps in the store at `url` (none running: min_machines_running 0)."""
    opened = await open_store(url, state_dir)
    try:
        for i in range(apps):
            config = msgspec.structs.replace(
                parse({"name": f"idle{i:05d}", "image": "r/idle:1",
                       "hosts": [f"idle{i:05d}.test"]}),
                uid=secrets.token_hex(8), release=1, image_digest=DIGEST)
            await opened.apps.create(config, Release(
                app=config.name, version=1, image=config.image, image_digest=DIGEST,
                config=config, strategy=config.deploy.strategy, status="complete",
                created_at=time.time(), reason="created"))
    finally:
        await opened.close()


def measure(services: Services, window_s: float) -> dict[str, float]:
    """Each process's CPU over `window_s`, % of one core."""
    pids = {name: proc.pid for name, proc in services.procs.items()}
    before = {name: cpu_s(pid) for name, pid in pids.items()}
    began = time.monotonic()
    time.sleep(window_s)
    spent = time.monotonic() - began
    return {name: 100 * (cpu_s(pid) - before[name]) / spent for name, pid in pids.items()}


def case(apps: int, placements: int, settle_s: float, window_s: float) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="thaw-bench-idle-"))
    postgres = PostgresServer() if placements > 1 else None
    services: Services | None = None
    try:
        store = ""
        if postgres is not None:
            postgres.start()
            store = postgres.create_database("idle")
        with start_redis_server() as redis:
            services = Services(work, redis.url, agents=0, placements=placements,
                                store=store, start_timeout_s=120)
            (work / "placement").mkdir(mode=0o700)
            asyncio.run(fill(store or "sqlite", work / "placement", apps))
            began = time.monotonic()
            services.start()
            print(f"  {apps} apps, {placements} placement(s): up in "
                  f"{time.monotonic() - began:.1f}s; settling {settle_s:.0f}s", flush=True)
            time.sleep(settle_s)
            figures = measure(services, window_s)
            services.stop()
            services = None
            return figures
    finally:
        if services is not None:
            services.stop()
        if postgres is not None:
            postgres.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--apps", type=int, nargs="+", default=[2000, 10000])
    parser.add_argument("--placements", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--settle-s", type=float, default=150.0)
    parser.add_argument("--window-s", type=float, default=30.0)
    args = parser.parse_args()
    rows = []
    for apps in args.apps:
        for placements in args.placements:
            rows.append((apps, placements,
                         case(apps, placements, args.settle_s, args.window_s)))
            print(f"  {rows[-1]}", flush=True)
    print(f"\nidle CPU, % of one core over {args.window_s:.0f}s (no machines, no traffic; "
          "1 placement: SQLite, 2: PostgreSQL)")
    print(f"{'apps':>6} {'placements':>10}  process CPU%")
    for apps, placements, figures in rows:
        shown = "  ".join(f"{name} {pct:5.1f}" for name, pct in sorted(figures.items()))
        print(f"{apps:>6} {placements:>10}  {shown}")


if __name__ == "__main__":
    main()
