"""Wakes across several placements and edges, and a herd of cold apps, every service a
separate process on one Redis (and one PostgreSQL when there are several placements).

    .venv/bin/python loadtests/bench_wakes.py [--rounds 5] [--burst 200] [--herd 200]
        [--herd-stopped 200] [--no-write]

1. Two edges, two placements: `--rounds` bursts of `--burst` cold requests, each on a new
   app (soft_limit 25, max 20, a 1 s boot), split across the two edges in a different
   ratio each round (1:1, 3:1, 1:3, ...): machines started against ceil(burst / 25).
2. A herd: `--herd` apps (one machine each, a tiny C server) woken at once through one
   edge, on three workers: machines per worker, and each request's hold time minus its
   machine's boot (both from Server-Timing), p50/p99, and the CPU each process spent
   over the burst, per wake. Then (`--herd-stopped`) the same for apps whose machines
   were started and stopped before: under the OCI driver, prepared containers.
Loopback only; bounded (every wait has a deadline); every process started is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.benchlib import (
    busy_s,
    cpu_s,
    cpu_times,
    machine_line,
    percentile,
    reaped_cpu_s,
    write_section,
)
from loadtests.tinyapp import build_tiny_image
from tests.support.agent_process import call, wait_until
from tests.support.credentials import ADMIN_TOKEN
from tests.support.postgres import running_postgres
from tests.support.redis_server import start_redis_server
from tests.support.services import Services
from thaw.imagebuild import BuildOverrides, build_image

ROOT = Path(__file__).resolve().parents[1]
ECHO = ROOT / "tests" / "e2e" / "apps" / "echo"
SOFT_LIMIT = 25
RATIOS = ((1, 1), (3, 1), (1, 3), (9, 1), (1, 9))


def create(services: Services, placement: int, name: str, image: str, **fields: Any) -> None:
    status, body = call("POST", f"{services.apis[placement]}/v1/apps", token=ADMIN_TOKEN,
                        body={"name": name, "image": image, "idle_timeout_s": 300,
                              "guest": {"cpus": 0.01, "memory_mb": 8}, **fields})
    if status != 201:
        raise SystemExit(f"create {name}: {status} {body}")


def live(services: Services, app: str) -> list[dict[str, Any]]:
    status, body = call("GET", f"{services.api}/v1/apps/{app}/machines", token=ADMIN_TOKEN)
    if status != 200:
        raise SystemExit(f"machines of {app}: {status} {body}")
    return [m for m in body if m["state"] not in ("destroying", "destroyed")]


def known(services: Services, edge: int, app: str) -> bool:
    _, state = call("GET", f"http://127.0.0.1:{services.admin_ports[edge]}/v1/state")
    return app in state["apps"]


def timing(header: str, name: str) -> float:
    for part in header.split(","):
        fields = dict(p.strip().partition("=")[::2] for p in part.split(";")[1:])
        if part.split(";")[0].strip() == name and "dur" in fields:
            return float(fields["dur"])
    return 0.0


async def get_all(targets: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """GET each (edge port, host, path) at once: (status, body, Server-Timing)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=60)) as session:
        async def one(port: int, host: str, path: str) -> tuple[int, str, str]:
            async with session.get(f"http://127.0.0.1:{port}{path}",
                                   headers={"Host": host}) as response:
                return (response.status, await response.text(),
                        response.headers.get("Server-Timing", ""))

        return await asyncio.gather(*(one(*t) for t in targets))


def two_edges(services: Services, image: str, rounds: int, burst: int) -> list[str]:
    rows = ["| round | split edge A : B | answers 200 | machines started | needed |",
            "|---|---|---|---|---|"]
    for r in range(rounds):
        a, b = RATIOS[r % len(RATIOS)]
        app = f"burst{r}"
        # a Python app: 8 MB (the herd's tiny C server's size) is below its interpreter's
        # own, and under the OCI driver's memory limit it never became ready
        create(services, r % 2, app, image, max_machines=20, guest={"cpus": 0.1, "memory_mb": 64},
               concurrency={"type": "requests", "soft_limit": SOFT_LIMIT, "hard_limit": 30})
        wait_until(lambda app=app: known(services, 0, app) and known(services, 1, app), 10, 0.05)
        on_a = burst * a // (a + b)
        targets = [(services.edge_ports[0 if i < on_a else 1], f"{app}.localhost", "/slow?s=0.3")
                   for i in range(burst)]
        answers = asyncio.run(get_all(targets))
        ok = sum(1 for status, _, _ in answers if status == 200)
        others = Counter(f"{status} {body[:80]}" for status, body, _ in answers if status != 200)
        if others:
            print("not 200:", dict(others), flush=True)
        started = len(live(services, app))
        needed = min(20, math.ceil(burst / SOFT_LIMIT))
        rows.append(f"| {r + 1} | {on_a} : {burst - on_a} | {ok} / {burst} | {started} | "
                    f"{needed} |")
        print(rows[-1], flush=True)
    return rows


@contextlib.contextmanager
def herd_platform(tmp: Path, redis_url: str,
                  edge_args: tuple[str, ...] = ()) -> Iterator[Services]:
    """One edge, one placement, three agents (8 cpus each) on `redis_url`, started and
    stopped. The agents' default heartbeat (1 s), not the tests' 0.5 s: a burst of ~70
    launches per agent on this machine's 2 cores delays an agent's loop past a 1.5 s
    TTL, and its worker is then taken for dead (its machines fenced)."""
    services = Services(tmp, redis_url, agents=3, agent_cpus=8, agent_memory_mb=8192,
                        heartbeat_s=1.0, edge_args=edge_args)
    try:
        services.start()
        wait_until(lambda: len(call("GET", f"{services.api}/v1/workers",
                                    token=ADMIN_TOKEN)[1]) == 3, 20)
        yield services
    finally:
        services.stop()


def cpu_snapshot(services: Services, redis_pid: int) -> dict[str, float]:
    """CPU seconds so far of each service process, of the children each agent reaped (the
    runtime's calls), of Redis, and of the whole machine (`machine`)."""
    snap = {name: cpu_s(proc.pid) for name, proc in services.procs.items()}
    snap.update({f"{name} (reaped children)": reaped_cpu_s(proc.pid)
                 for name, proc in services.procs.items() if name.startswith("agent")})
    snap["redis"] = cpu_s(redis_pid)
    snap["machine"] = busy_s(cpu_times())
    return snap


def cpu_rows(before: dict[str, float], after: dict[str, float], wakes: int) -> list[str]:
    """The platform's CPU per wake, per process, between two `cpu_snapshot`s; `the rest`
    is the machine's busy time no listed process accounts for (the machines themselves,
    runtime processes not yet reaped, the load generator, the kernel's own work)."""
    spent = {name: after[name] - before[name] for name in before}
    machine = spent.pop("machine")
    rows = ["| process | CPU s over the burst | ms per wake |", "|---|---|---|"]
    for name, seconds in [*spent.items(), ("the rest", machine - sum(spent.values())),
                          ("the machine, every core", machine)]:
        rows.append(f"| {name} | {seconds:.2f} | {1000 * seconds / wakes:.1f} |")
    return rows


def stop_all(services: Services, names: list[str]) -> None:
    """Each app woken (20 at a time, until answered 200) and its machine stopped through
    the API: under the OCI driver a stopped machine is a created container, so the next
    wake is the runtime's start alone."""
    left = list(names)
    for _ in range(10):
        for i in range(0, len(left), 20):
            asyncio.run(get_all([(services.edge_ports[0], f"{n}.localhost", "/")
                                 for n in left[i:i + 20]]))
        left = [n for n in left if not any(m["state"] == "started" for m in live(services, n))]
        if not left:
            break
    if left:
        raise SystemExit(f"{len(left)} apps never started: {left[:5]}")

    def stop(name: str) -> None:
        started: list[dict[str, Any]] = []

        def found() -> bool:
            started[:] = [m for m in live(services, name) if m["state"] == "started"]
            return bool(started)

        wait_until(found, 20)
        act(services, name, started[0]["id"], "stop", "stopped")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(stop, names))
    time.sleep(3)  # a stopped OCI machine is created again after its stop; the edges hear


def act(services: Services, app: str, mid: str, action: str, state: str,
        *, ask: bool = True) -> None:
    """`action` (stop, suspend, start) machine `mid` of `app` through the API (unless not
    `ask`) and wait until it is in `state`."""
    base = f"{services.api}/v1/apps/{app}/machines/{mid}"
    if ask:
        status, body = call("POST", f"{base}/{action}", token=ADMIN_TOKEN)
        if status != 200:
            raise SystemExit(f"{action} {app}: {status} {body}")
    status, body = call("GET", f"{base}/wait?state={state}&timeout_s=30", timeout_s=40,
                        token=ADMIN_TOKEN)
    if status != 200:
        raise SystemExit(f"{action} {app}: {status} {body}")


def redis_calls(url: str) -> Counter[str]:
    """Redis's count of calls per command so far (INFO commandstats)."""
    client = redis.Redis.from_url(url)
    try:
        return Counter({name.removeprefix("cmdstat_"): int(stats["calls"])
                        for name, stats in client.info("commandstats").items()})
    finally:
        client.close()


def herd(services: Services, image: str, apps: int, redis_pid: int,
         stopped: bool = False) -> list[str]:
    """`apps` new apps woken at once through one edge: their first machines created, or
    (`stopped`) their machines, created and stopped before, started."""
    names = [f"{'stopped' if stopped else 'herd'}{i}" for i in range(apps)]
    for name in names:
        create(services, 0, name, image)
    wait_until(lambda: all(known(services, 0, n) for n in names[-5:]), 20, 0.1)
    if stopped:
        stop_all(services, names)
    before, calls = cpu_snapshot(services, redis_pid), redis_calls(services.redis_url)
    began = time.monotonic()
    answers = asyncio.run(get_all([(services.edge_ports[0], f"{n}.localhost", "/")
                                   for n in names]))
    took_s = time.monotonic() - began
    cpu = cpu_rows(before, cpu_snapshot(services, redis_pid), apps)
    calls = redis_calls(services.redis_url) - calls
    cpu += ["", f"Redis commands over the burst, per wake: {calls.total() / apps:.1f} ("
            + ", ".join(f"{name} {n / apps:.1f}" for name, n in calls.most_common(8)) + ")"]
    print("\n".join(cpu), flush=True)
    per_worker: Counter[str] = Counter()
    for name in names:
        for machine in live(services, name):
            per_worker[machine["worker"]] += 1
    spread = " / ".join(f"{w}: {n}" for w, n in sorted(per_worker.items()))
    line = herd_line(answers, f"{apps} | ", f" {spread} |", took_s)
    print(line, flush=True)
    return ["| apps | answers 200 | machines per worker | hold minus boot p50 ms | p99 ms | "
            "burst took s |", "|---|---|---|---|---|---|", line, "",
            "The platform's CPU over the burst (from the first request sent to the last "
            "answer), per process (/proc/PID/stat), divided by the wakes:", "", *cpu]


def herd_line(answers: list[tuple[int, str, str]], first: str, middle: str,
              took_s: float) -> str:
    """A herd's table row: `first` cells, answers 200 of all, `middle` cells, hold minus
    boot p50/p99 (from Server-Timing) and the burst's time; what was not 200 is printed."""
    waits = [timing(st, "hold") - timing(st, "boot") for status, _, st in answers
             if status == 200 and "hold" in st]
    ok = sum(1 for status, _, _ in answers if status == 200)
    others = Counter(f"{status} {body[:60]}" for status, body, _ in answers if status != 200)
    if others:
        print("not 200:", dict(others), flush=True)
    if not waits:
        return "| no answers |"
    return (f"| {first}{ok} / {len(answers)} |{middle} {percentile(waits, 50):.0f} | "
            f"{percentile(waits, 99):.0f} | {took_s:.1f} |")


def herd_among(services: Services, image: str, apps: int, present: int) -> list[str]:
    """`apps` cold apps woken at once through both edges (half each) of the two-placement
    platform, with `present` idle apps configured (created through both placements)."""
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: create(services, i % 2, f"idle{i}", image), range(present)))
    names = [f"among{i}" for i in range(apps)]
    for i, name in enumerate(names):
        create(services, i % 2, name, image)
    wait_until(lambda: all(known(services, e, n) for e in (0, 1) for n in names[-5:]), 30, 0.1)
    began = time.monotonic()
    answers = asyncio.run(get_all([(services.edge_ports[i % 2], f"{n}.localhost", "/")
                                   for i, n in enumerate(names)]))
    took_s = time.monotonic() - began
    line = herd_line(answers, f"{present} | {apps} | ", "", took_s)
    print(line, flush=True)
    return ["| apps present | herd | answers 200 | hold minus boot p50 ms | p99 ms | "
            "burst took s |", "|---|---|---|---|---|---|", line]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--herd", type=int, default=200)
    parser.add_argument("--herd-stopped", type=int, default=200,
                        help="then a herd of this many apps whose machines were started and "
                        "stopped before (prepared containers): the runtime's start alone")
    parser.add_argument("--among", type=int, default=0,
                        help="also: a herd of --among-herd cold apps through both edges of the "
                        "two-placement platform with this many idle apps present (issue 25)")
    parser.add_argument("--among-herd", type=int, default=100)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the services' directories")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="thaw-wakes-"))
    try:
        # under each platform's directory: placement accepts layouts only there
        build_image(ECHO, "echo:slowboot", layout=work / "two" / "layout",
                    overrides=BuildOverrides(entrypoint=["python3", "app.py", "--boot-delay",
                                                         "1"]))
        # the herd's machines boot in ~1 ms of CPU: 200 Python interpreters starting at once
        # on this machine's 2 cores would measure CPU starvation instead of the platform
        herd_image = build_tiny_image(work / "herd" / "layout")
        bursts: list[str] = []
        among: list[str] = []
        with start_redis_server() as redis, running_postgres() as postgres:
            services = Services(work / "two", redis.url, agents=3, placements=2, edges=2,
                                store=postgres.url(), agent_cpus=8, agent_memory_mb=8192)
            try:
                if args.rounds:
                    services.start()
                    wait_until(lambda: len(call("GET", f"{services.api}/v1/workers",
                                                token=ADMIN_TOKEN)[1]) == 3, 20)
                bursts = two_edges(services, f"oci:{work / 'two' / 'layout'}:slowboot", args.rounds,
                                   args.burst)
                if args.among:
                    if not args.rounds:
                        services.start()
                        wait_until(lambda: len(call("GET", f"{services.api}/v1/workers",
                                                    token=ADMIN_TOKEN)[1]) == 3, 20)
                    tiny = build_tiny_image(work / "two" / "tiny")
                    among = herd_among(services, tiny, args.among_herd, args.among)
            finally:
                services.stop()
        with start_redis_server() as redis, herd_platform(work / "herd", redis.url) as services:
            herded = herd(services, herd_image, args.herd, redis.pid) if args.herd else []
            if args.herd_stopped:
                herded += ["", "The same platform, then a herd of apps whose machines were "
                           "woken and stopped before (created containers: a wake is the "
                           "runtime's start):", "",
                           *herd(services, herd_image, args.herd_stopped, redis.pid,
                                 stopped=True)]
    finally:
        if args.keep:
            print(f"kept {work} (the services' logs)")
        else:
            shutil.rmtree(work, ignore_errors=True)
    body = "\n".join([
        "## Wakes across two edges and two placements; a herd of cold apps", "",
        f"Machine: {machine_line()}", "",
        "Command: `.venv/bin/python loadtests/bench_wakes.py "
        f"--rounds {args.rounds} --burst {args.burst} --herd {args.herd} "
        f"--herd-stopped {args.herd_stopped}"
        + (f" --among {args.among} --among-herd {args.among_herd}" if args.among else "")
        + "`", "",
        f"Two placements and two edges on one Redis and one PostgreSQL, three agents; each "
        f"round a new app (soft_limit {SOFT_LIMIT}, max 20, 1 s boot) gets a burst of "
        f"{args.burst} cold requests split across the edges:", "", *bursts, "",
        "A herd of cold apps (one machine each: loadtests/apps/tinyhttp.c, a C server whose "
        "boot costs ~1 ms of CPU, so that 200 boots do not starve this 2-core machine) woken "
        "at once through one edge, one placement, three workers (8 cpus each); machines per "
        "worker as listed at the end:", "", *herded, "",
        *(["A herd among many apps (issue 25): on the two-placement platform above, "
           f"`--among {args.among} --among-herd {args.among_herd}`: that many idle apps "
           "configured, then the herd's cold apps (the tiny C server) woken at once "
           "through both edges:", "", *among, ""] if among else []),
        "Machines started equal machines needed only because each wake says its edge's "
        "demand and placement sums it (docs/scaling-out.md); before that, in this test's "
        "e2e twin, 5 to 7 of 8. The herd's spread comes from the ledger counting offers "
        "when sent and `starting` being a gate per core (docs/placement.md): before "
        "those, the same herd went 100 / 28 / 22 (and, before the Redis clients waited "
        "for a free connection, half its wakes failed with \"Too many connections\"). "
        "Hold minus boot is the platform's own time for 200 wakes at once on 2 cores "
        "shared by the edge, placement, three agents, Redis, the runtime and the load "
        "generator. Since issues 23 and 24 a first wake is a full OCI create (the "
        "container, its rootfs mount, its network namespace and veth): most of its CPU is "
        "runc's and the kernel's ('reaped children', 'the rest'); the herds recorded "
        "before 2026-11-27 (hold minus boot p50 1.2-1.8 s) ran under bubblewrap. A wake "
        "of a stopped machine is the runtime's start of a prepared container.",
    ])
    print(body)
    if not args.no_write:
        write_section("bench-wakes", body)


if __name__ == "__main__":
    main()
