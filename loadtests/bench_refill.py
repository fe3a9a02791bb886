"""Redis restarted empty under many apps: how long until the shared view is whole again.
Every service a separate process on a real Redis (placement, 2 agents, edge), as an
operator runs them.

    .venv/bin/python loadtests/bench_refill.py [--apps 2000] [--warm 8] [--trials 3]

`--apps` apps, `--warm` of them with `min_machines_running = 1` (a started machine
each), the rest without machines (`auto_start = false`, so that a probe starts none).
Each trial kills -9 Redis, restarts it empty on the same port and measures, from the
moment it accepts connections again:
- apps: until every app is back in the registry (placement's republish);
- workers: until every agent's heartbeat names the new generation (its layers and
  machines published again);
- view: until the edge's view is authoritative again (placement marked the refill
  done and the edge did its one pruning load; the edge's /v1/state);
and, over the trial, the edge's answers to a probe cycling through every app without
pause (404s: apps the edge forgot) and the machines each agent runs before and after
(duplicates: a second machine made for an app while the agents were not back).
Median and max over the trials. Prints; writes nothing. Loopback only; bounded (each
wait has a deadline); every process started is stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ground.registry import keys
from ground.registry.types import WorkerStatus
from loadtests.benchlib import machine_line, median
from tests.support.agent_process import call, kill_group, wait_until
from tests.support.credentials import ADMIN_TOKEN
from tests.support.redis_server import start_redis_server
from tests.support.services import Services, app_machines, edge_get
from thaw.imagebuild import build_image

HELLO = Path(__file__).resolve().parent.parent / "examples" / "hello"
COMMAND = "python loadtests/bench_refill.py"


def create(services: Services, name: str, image: str, warm: bool) -> None:
    body: dict[str, Any] = {"name": name, "image": image, "idle_timeout_s": 3600,
                            "guest": {"cpus": 0.1, "memory_mb": 32}}
    body.update({"min_machines_running": 1} if warm else {"auto_start": False})
    for _ in range(5):  # (concurrent creates on SQLite may meet a busy database: again)
        status, answer = call("POST", f"{services.api}/v1/apps", body, token=ADMIN_TOKEN,
                              timeout_s=120)
        if status < 500:
            break
        time.sleep(0.5)
    assert status == 201 or (status == 409 and answer.get("error") == "exists"), answer


def edge_registry(services: Services) -> dict[str, Any]:
    _, state = call("GET", f"http://127.0.0.1:{services.admin_port}/v1/state", timeout_s=60)
    return state["registry"]  # type: ignore[no-any-return]


def edge_known(services: Services) -> set[str]:
    _, state = call("GET", f"http://127.0.0.1:{services.admin_port}/v1/state", timeout_s=60)
    return set(state["apps"])


def edge_apps(services: Services) -> int:
    _, state = call("GET", f"http://127.0.0.1:{services.admin_port}/v1/state", timeout_s=60)
    print(f"the edge's view: {len(state['apps'])} apps", flush=True)
    return len(state["apps"])


class Probe:
    """GETs through the edge cycling over `hosts`, one thread, without pause."""

    def __init__(self, services: Services, hosts: list[str]) -> None:
        self.services, self.hosts = services, hosts
        self.statuses: Counter[int] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        at = 0
        while not self._stop.is_set():
            try:
                status = edge_get(self.services, self.hosts[at % len(self.hosts)])[0]
            except OSError:
                status = 0
            self.statuses[status] += 1
            at += 1


def workers_back(fresh: redis.Redis, generation: str, count: int) -> bool:
    found = [fresh.get(keys.worker(f"w{i}")) for i in range(count)]
    return all(raw is not None and msgspec.json.decode(raw, type=WorkerStatus).generation
               == generation for raw in found)


def trial(services: Services, servers: contextlib.ExitStack, redis_port: int, redis_pid: int,
          names: list[str], probed: list[str], warm: list[str]) -> tuple[dict[str, Any], int]:
    """One restart (the new Redis kept in `servers`), `probed` apps asked for through the
    edge meanwhile; the figures and the new Redis's pid (the next trial kills it)."""
    before = services.machines_at_agents()
    url = f"redis://127.0.0.1:{redis_port}/0"
    with Probe(services, [f"{n}.localhost" for n in probed]) as probe:
        time.sleep(1.0)
        kill_group(redis_pid)
        time.sleep(1.0)
        restarted = servers.enter_context(start_redis_server(port=redis_port))
        back = time.monotonic()
        fresh = redis.Redis.from_url(url, decode_responses=True)
        figures: dict[str, Any] = {}
        wait_until(lambda: fresh.hlen(keys.apps()) == len(names), 120, interval_s=0.02)
        figures["apps_s"] = time.monotonic() - back
        generation = str(fresh.get(keys.generation()))
        wait_until(lambda: workers_back(fresh, generation, services.agents), 120,
                   interval_s=0.02)
        figures["workers_s"] = time.monotonic() - back

        def authoritative() -> bool:
            state = edge_registry(services)
            return not state["rebuilding"] and state["generation"] == generation

        wait_until(authoritative, 120, interval_s=0.05)
        figures["view_s"] = time.monotonic() - back
        time.sleep(6.0)  # a timer pass of the reconciler over every app, after the refill
        fresh.close()
    after = services.machines_at_agents()
    figures["not_found"] = probe.statuses.get(404, 0)
    figures["probes"] = sum(probe.statuses.values())
    figures["duplicates"] = sum(max(0, after[n] - before[n]) for n in warm)
    figures["lost"] = sum(max(0, before[n] - after[n]) for n in warm)
    return figures, restarted.pid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--apps", type=int, default=2000)
    parser.add_argument("--warm", type=int, default=8)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="thaw-bench-refill-"))
    names = [f"app{n:05d}" for n in range(args.apps)]
    warm = names[:args.warm]
    with contextlib.ExitStack() as servers:
        first = servers.enter_context(start_redis_server())
        services = Services(tmp, first.url).start()
        try:
            layout = tmp / "layout"
            build_image(HELLO, "hello:v1", layout=layout)
            image = f"oci:{layout}:v1"
            wait_until(lambda: len(call("GET", f"{services.api}/v1/workers",
                                        token=ADMIN_TOKEN)[1]) == 2, 30)
            began = time.monotonic()
            for number, name in enumerate(names):
                create(services, name, image, name in warm)
                if (number + 1) % 250 == 0:
                    print(f"{number + 1} apps created in {time.monotonic() - began:.1f} s",
                          flush=True)
            wait_until(lambda: all(any(m["state"] == "started"
                                       for m in app_machines(services, n)) for n in warm),
                       300, interval_s=1.0)
            # (a create whose registry write failed, as placement's Redis pool ran dry
            # under 2,000 apps' passes, is not in the registry until a refill: what the
            # edge knows is what is probed)
            in_registry = redis.Redis.from_url(first.url).hlen(keys.apps())
            wait_until(lambda: edge_apps(services) >= in_registry, 300, interval_s=1.0)
            known = sorted(edge_known(services))
            if len(known) < len(names):
                print(f"{len(names) - len(known)} apps not in the registry before the "
                      "first restart (probed only after)")
            results = []
            pid = first.pid
            for number in range(args.trials):
                figures, pid = trial(services, servers, first.port, pid, names, known, warm)
                known = names
                results.append(figures)
                print(f"trial {number + 1}: " + ", ".join(
                    f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in figures.items()), flush=True)
        except BaseException:
            print(f"logs kept in {tmp}")
            services.stop()
            raise
        services.stop()
        for log in sorted(tmp.glob("*.log")):  # placement's and the edge's own account
            for line in log.read_text(errors="replace").splitlines():
                if any(w in line for w in ("published again in", "refill:", "authoritative")):
                    print(f"{log.stem}: {line[:200]}")
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{COMMAND} --apps {args.apps} --warm {args.warm} --trials {args.trials}")
    print(machine_line())
    for key in ("apps_s", "workers_s", "view_s"):
        values = [r[key] for r in results]
        print(f"{key:>10}: median {median(values):.2f} s, max {max(values):.2f} s")
    print(f" not_found: {sum(r['not_found'] for r in results)} of "
          f"{sum(r['probes'] for r in results)} probes")
    for key in ("duplicates", "lost"):
        print(f"{key:>10}: {sum(r[key] for r in results)} machines of {len(warm)} warm apps "
              f"over {args.trials} trials")


if __name__ == "__main__":
    main()
