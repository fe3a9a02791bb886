"""Where a resume's time goes: the herd platform of `bench_wakes.py` (one edge, one
placement, three agents as processes on one Redis, the OCI driver), `--apps` apps (the
tiny C server) started, then suspended; one request at a time wakes each (a resume:
the freezer thawed), `--rounds` times. Prints, p50/p90 in ms: the client's time to the
first byte, and its parts from the answer's Server-Timing — `boot` (the agent: start
asked to ready), `place` (placement's own part of the wake: lease, demand, registry
reads, the call to the agent), `hold` (the edge: from holding the request to its
release) — with what is left of each level (hold - place - boot: the edge↔placement
round trip and the edge's own hold work; TTFB - hold: the client↔edge exchange and the
forward to the machine); then each process's CPU per resume (`/proc` deltas), less
its CPU over an idle window as long (heartbeats, feeds, the reconciler's rounds).

    .venv/bin/python loadtests/profile_resume.py [--apps 20] [--rounds 3] [--spy]

`--trace`: then one more resume of each of three apps under Redis's MONITOR, each
command printed with its time from the client's send and the process that sent it
(`lua`: run inside a script): the round trips on a resume's path, in order.

`--spy`: py-spy samples placement, the resuming agents and the edge during the resumes
(`.venv/bin/pip install py-spy` once; not a test dependency) and prints each one's
functions by share of samples, inclusive (`/tmp/resume-profile-<service>.txt`: raw).

Loopback only; every process started is stopped; the work directory is removed.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.bench_cold import ttfb
from loadtests.bench_wakes import (
    act,
    cpu_rows,
    cpu_snapshot,
    create,
    herd_platform,
    known,
    live,
)
from loadtests.bench_wakes import timing as timing_of
from loadtests.tinyapp import build_tiny_image
from tests.support.agent_process import wait_until
from tests.support.redis_server import start_redis_server
from tests.support.services import Services


def settle(services: Services, app: str, action: str, state: str) -> None:
    """`action` (start, suspend) the app's one machine through the API and wait for `state`."""
    machine: list[dict[str, Any]] = []

    def found() -> bool:
        machine[:] = live(services, app)
        return bool(machine)

    wait_until(found, 20)
    act(services, app, machine[0]["id"], action, state, ask=machine[0]["state"] != state)


PY_SPY = Path(sys.executable).parent / "py-spy"


def spies(services: Services, turn: int) -> list[subprocess.Popen[bytes]]:
    """py-spy on each service process, raw stacks in /tmp/resume-profile-NAME.TURN.txt
    (stopped with SIGINT)."""
    return [subprocess.Popen(
        [str(PY_SPY), "record", "-p", str(proc.pid), "-r", "1000", "-f", "raw",
         "--nonblocking", "-o", f"/tmp/resume-profile-{name}.{turn}.txt"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for name, proc in services.procs.items()]


def inclusive(name: str, top: int = 25) -> None:
    """`name`'s functions by the share of its samples they are on the stack of."""
    counts: Counter[str] = Counter()
    total = 0
    for path in Path("/tmp").glob(f"resume-profile-{name}.*.txt"):
        for line in path.read_text().splitlines():
            stack, _, count = line.rstrip().rpartition(" ")
            if not stack:
                continue
            total += int(count)
            for frame in set(stack.split(";")):
                function, _, where = frame.partition(" (")
                counts[f"{function} {where.rsplit('/', 1)[-1].split(':')[0]}"] += int(count)
    print(f"{name}: {total} samples (1 ms each)")
    for frame, n in counts.most_common(top):
        print(f"  {100 * n / max(1, total):5.1f}% {frame[:110]}")


def trace(services: Services, names: list[str], redis_url: str, redis_port: int) -> None:
    """One resume of each of `names` under MONITOR: its Redis commands in order."""
    from loadtests.monitor_herd import ports_to_pids

    for name in names:
        settle(services, name, "suspend", "suspended")
    time.sleep(1.0)
    seen: list[tuple[float, str, str, str]] = []
    done = threading.Event()

    def monitor() -> None:
        client = redis.Redis.from_url(redis_url)
        with client.monitor() as stream:  # type: ignore[no-untyped-call]
            for entry in stream.listen():
                seen.append((entry["time"], entry.get("client_type", ""),
                             str(entry["client_port"]), entry["command"]))
                if done.is_set():
                    break

    threading.Thread(target=monitor, daemon=True).start()
    time.sleep(0.5)
    pids = ports_to_pids(redis_port)
    names_of = {proc.pid: name for name, proc in services.procs.items()}
    for name in names:
        first, began = len(seen), time.time()
        elapsed, status, timing = ttfb(services.edge_ports[0], name)
        time.sleep(0.3)
        pids.update(ports_to_pids(redis_port))
        print(f"{name}: {status} in {elapsed:.2f} ms ({timing})")
        for at, kind, port, command in seen[first:]:
            who = "  lua" if kind == "lua" else names_of.get(pids.get(port, 0), f"port {port}")
            if at >= began - 0.001:
                print(f"  {(at - began) * 1000:8.2f} {who:10} {command[:110]}")
    done.set()


def quantiles(values: list[float]) -> str:
    v = sorted(values)
    return f"p50 {v[len(v) // 2]:6.2f}  p90 {v[int(len(v) * 0.9)]:6.2f}  (n={len(v)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--apps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spy", action="store_true")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--no-direct-thaw", action="store_true",
                        help="the edge leaves each resume to placement's wake alone")
    args = parser.parse_args()
    if args.spy and not PY_SPY.exists():
        raise SystemExit(f"{PY_SPY} not found: .venv/bin/pip install py-spy")
    for old in Path("/tmp").glob("resume-profile-*.txt"):
        old.unlink()
    work = Path(tempfile.mkdtemp(prefix="thaw-resume-profile-"))
    parts: dict[str, list[float]] = {}
    try:
        image = build_tiny_image(work / "herd" / "layout")
        with start_redis_server() as server, herd_platform(
                work / "herd", server.url,
                ("--no-direct-thaw",) if args.no_direct_thaw else ()) as services:
            names = [f"res{i}" for i in range(args.apps)]
            for name in names:
                create(services, 0, name, image, auto_stop="suspend")
            wait_until(lambda: all(known(services, 0, n) for n in names), 20, 0.1)
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda n: ttfb(services.edge_ports[0], n), names))  # started
            redis_pid = server.pid
            snapshots: list[dict[str, float]] = []
            for turn in range(args.rounds):
                with ThreadPoolExecutor(4) as pool:
                    list(pool.map(lambda n: settle(services, n, "suspend", "suspended"),
                                  names))
                time.sleep(1.0)  # the edge hears of every suspend through the feed
                spying = spies(services, turn) if args.spy else []
                time.sleep(0.3 if spying else 0.0)
                snapshots.append(cpu_snapshot(services, redis_pid))
                began = time.monotonic()
                for name in names:
                    elapsed, status, timing = ttfb(services.edge_ports[0], name)
                    if status != 200:
                        raise SystemExit(f"{name}: resumed with {status}")
                    hold, place, boot = (timing_of(timing, p) for p in ("hold", "place", "boot"))
                    for key, value in (("ttfb", elapsed), ("hold", hold), ("place", place),
                                       ("boot", boot), ("hold - place - boot",
                                                        hold - place - boot),
                                       ("ttfb - hold", elapsed - hold)):
                        parts.setdefault(key, []).append(value)
                snapshots.append(cpu_snapshot(services, redis_pid))
                took = time.monotonic() - began
                for spy in spying:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(timeout=30)
                idle = cpu_snapshot(services, redis_pid)  # as long a window, no resumes
                time.sleep(took)
                idle_after = cpu_snapshot(services, redis_pid)
                for name in snapshots[-1]:
                    snapshots[-1][name] -= idle_after[name] - idle[name]
            print(f"{args.apps} apps x {args.rounds} rounds of resumes, one at a time (ms):")
            for key, values in parts.items():
                print(f"  {key:22} {quantiles(values)}")
            total = {name: sum(snapshots[i + 1][name] - snapshots[i][name]
                               for i in range(0, len(snapshots), 2)) for name in snapshots[0]}
            print("CPU per resume, less an idle window as long:")
            print("\n".join(cpu_rows(dict.fromkeys(total, 0.0), total,
                                     args.apps * args.rounds)))
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{services.admin_ports[0]}/metrics", timeout=10) as answer:
                thaws = [line for line in answer.read().decode().splitlines()
                         if line.startswith("thaw_edge_direct_thaws_total")]
            print("the edge's own thaws:", ", ".join(thaws) or "none")
            if args.spy:
                for name in services.procs:
                    inclusive(name)
            if args.trace:
                trace(services, names[:3], server.url, server.port)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
