"""Host failure and rolling deploys under steady load, every service a separate process on
a real Redis (placement, 3 agents, edge), as an operator runs them.

    .venv/bin/python loadtests/bench_failover.py [--trials 10] [--rate 40] [--rolls 3]
        [--no-write]

1. Failover: `--trials` kills of a host with a spare and as many without, alternated.
   Each trial creates an app (min 1 machine; spares 1 or 0), puts `--rate` GETs/s of
   steady load on it through the edge, kills -9 the agent of the worker running the
   machine and every machine process it started, and measures: requests that failed
   (any answer but 200), the latency of the requests in flight at the kill or sent in
   the 2 s after it (p50/p99/max, and added over the pre-kill median), and the time
   until the app has its shape again on live workers (a started machine, and a spare
   when it has one). Then the agent restarts (its replaced machine is destroyed) and the
   app is deleted.
2. Rolling deploy: `--rolls` deploys of a new image to an app of 3 started machines
   under the same load: duration (deploy call to every machine on the new release) and
   failed requests.
3. `--faults` (instead of 1 and 2): the control plane's bad day, loadtests/faults.py —
   Redis stalled 10 s, Redis restarted empty, a placement killed, PostgreSQL stopped
   20 s, a rolling deploy — `--fault-trials` each, interleaved, with `--apps` idle apps
   present: one table (failed/total, recovery, machines destroyed/duplicated/leaked).
Loopback only; bounded (each wait has a deadline); every process started is stopped.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.benchlib import machine_line, median, percentile, write_section
from loadtests.faults import run_faults
from tests.support.agent_process import call, wait_until
from tests.support.credentials import ADMIN_TOKEN
from tests.support.load import SteadyLoad
from tests.support.redis_server import start_redis_server
from tests.support.services import Services, app_machines, edge_get
from thaw.imagebuild import BuildOverrides, build_image

HELLO = Path(__file__).resolve().parent.parent / "examples" / "hello"
COMMAND = "python loadtests/bench_failover.py"


def shaped(machines: list[dict[str, Any]], spares: int, avoid: str = "") -> bool:
    states = sorted(m["state"] for m in machines)
    want = sorted(["started"] + ["created"] * spares)
    workers = {m["worker"] for m in machines}
    return states == want and len(workers) == len(machines) and avoid not in workers


def api(services: Services, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return call(method, f"{services.api}{path}", body, token=ADMIN_TOKEN)


def trial(services: Services, image: str, name: str, spares: int,
          rate: float) -> dict[str, Any]:
    status, body = api(services, "POST", "/v1/apps", {
        "name": name, "image": image, "idle_timeout_s": 300, "min_machines_running": 1,
        "spares": spares, "guest": {"cpus": 0.25, "memory_mb": 64},
    })
    assert status == 201, body
    wait_until(lambda: shaped(app_machines(services, name), spares), 60)
    host = f"{name}.localhost"
    wait_until(lambda: edge_get(services, host)[0] == 200, 10)
    [victim] = [m for m in app_machines(services, name) if m["state"] == "started"]
    lost = victim["worker"]
    with SteadyLoad(services.edge_port, host, rate=rate) as load:
        time.sleep(1.5)
        killed_at = time.monotonic()
        services.kill_host(int(lost[1:]))
        try:
            wait_until(lambda: shaped(app_machines(services, name), spares, avoid=lost), 60)
        except AssertionError:
            print("not restored:", app_machines(services, name),
                  api(services, "GET", f"/v1/apps/{name}/events")[1][:10],
                  api(services, "GET", "/v1/workers")[1], sep="\n")
            raise
        restored_s = time.monotonic() - killed_at
        time.sleep(max(0.0, killed_at + 3.0 - time.monotonic()))
    before = [a.seconds for a in load.answers if a.started + a.seconds < killed_at]
    hit = [a for a in load.answers
           if a.started <= killed_at + 2.0 and a.started + a.seconds >= killed_at]
    failed = sum(1 for a in load.answers if a.status != 200)
    services.restart(f"agent-{lost[1:]}")
    wait_until(lambda: services.destroyed_on(lost, name, victim["id"]), 30)
    status, body = api(services, "DELETE", f"/v1/apps/{name}")
    assert status == 200, body
    return {"spares": spares, "requests": len(load.answers), "failed": failed,
            "codes": dict(Counter(a.status for a in load.answers)),
            "baseline_ms": median(before) * 1000,
            "hit_ms": [a.seconds * 1000 for a in hit], "restored_s": restored_s}


def roll(services: Services, images: dict[str, str], name: str, rate: float) -> dict[str, Any]:
    status, body = api(services, "POST", "/v1/apps", {
        "name": name, "image": images["v1"], "idle_timeout_s": 300, "min_machines_running": 3,
        "max_machines": 6, "health": {"path": "/healthz", "timeout_s": 5},
        "guest": {"cpus": 0.25, "memory_mb": 64},
    })
    assert status == 201, body

    def on(version: int) -> bool:
        found = app_machines(services, name)
        return len(found) == 3 and all(m["state"] == "started" and m["release"] == version
                                       for m in found)

    wait_until(lambda: on(1), 60)
    host = f"{name}.localhost"
    wait_until(lambda: edge_get(services, host)[0] == 200, 10)
    with SteadyLoad(services.edge_port, host, rate=rate) as load:
        time.sleep(1.0)
        began = time.monotonic()
        status, body = api(services, "POST", f"/v1/apps/{name}/deploy", {"image": images["v2"]})
        assert status == 200, body
        wait_until(lambda: on(2), 120)
        took = time.monotonic() - began
        time.sleep(1.0)
    _, releases = api(services, "GET", f"/v1/apps/{name}/releases")
    api(services, "DELETE", f"/v1/apps/{name}")
    return {"seconds": took, "requests": len(load.answers),
            "failed": sum(1 for a in load.answers if a.status != 200),
            "status": releases[0]["status"]}


def summary(results: list[dict[str, Any]], spares: int) -> str:
    rows = [r for r in results if r["spares"] == spares]
    hit = [ms for r in rows for ms in r["hit_ms"]]
    added = [ms - r["baseline_ms"] for r in rows for ms in r["hit_ms"]]
    restored = [r["restored_s"] for r in rows]
    return (f"| {spares} | {len(rows)} | {sum(r['requests'] for r in rows)} | "
            f"{sum(r['failed'] for r in rows)} | {len(hit)} | "
            f"{percentile(hit, 50):.0f} / {percentile(hit, 99):.0f} / {max(hit):.0f} | "
            f"{percentile(added, 50):.0f} / {percentile(added, 99):.0f} / {max(added):.0f} | "
            f"{percentile(restored, 50):.2f} / {percentile(restored, 99):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--rolls", type=int, default=3)
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--faults", nargs="?", const="all", default="",
                        help="the fault table instead (all, or a comma list of: redis-stall, "
                        "redis-restart, placement-kill, pg-stop, deploy)")
    parser.add_argument("--fault-trials", type=int, default=3)
    parser.add_argument("--apps", type=int, default=2000,
                        help="idle apps present during the faults")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work dir (every service's log) when a trial fails")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="thaw-failover-"))
    try:
        run(args, work)
    except BaseException:
        if args.keep:
            print(f"logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
        raise
    shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> None:
    if args.faults:
        faults(args, work)
        return
    with start_redis_server() as redis:
        build_image(HELLO, "hello:v1", layout=work / "v1")
        build_image(HELLO, "hello:v2", layout=work / "v2",
                    overrides=BuildOverrides(env={"GREETING": "hi"}))
        images = {"v1": f"oci:{work / 'v1'}:v1", "v2": f"oci:{work / 'v2'}:v2"}
        services = Services(work, redis.url, agents=3).start()
        results: list[dict[str, Any]] = []
        rolls: list[dict[str, Any]] = []
        try:
            wait_until(lambda: len(api(services, "GET", "/v1/workers")[1]) == 3, 20)
            for i in range(args.trials * 2):
                spares = 1 - i % 2  # alternated: with a spare, without
                result = trial(services, images["v1"], f"fo{i}", spares, args.rate)
                results.append(result)
                print(f"trial {i} spares={spares}: {result['failed']} failed of "
                      f"{result['requests']}, restored in {result['restored_s']:.2f}s, "
                      f"slowest hit {max(result['hit_ms']):.0f} ms", flush=True)
            for i in range(args.rolls):
                rolls.append(roll(services, images, f"roll{i}", args.rate))
                print(f"roll {i}: {rolls[-1]}", flush=True)
        finally:
            services.stop()
    table = "\n".join([
        "| spares | trials | requests | failed | hit requests | hit latency ms p50 / p99 / "
        "max | added ms p50 / p99 / max | restored s p50 / p99 |",
        "|---|---|---|---|---|---|---|---|",
        summary(results, 1), summary(results, 0),
    ])
    roll_table = "\n".join([
        "| deploy | machines | seconds | requests | failed | release |",
        "|---|---|---|---|---|---|",
        *(f"| {i + 1} | 3 | {r['seconds']:.2f} | {r['requests']} | {r['failed']} | "
          f"{r['status']} |" for i, r in enumerate(rolls)),
    ])
    body = (f"## Failover and rolling deploys (issue 9)\n\n`{COMMAND} --trials {args.trials} "
            f"--rolls {args.rolls} --rate {args.rate:g}`, {machine_line()}. Placement, 3 "
            "agents (heartbeat 0.5 s) and the edge as separate processes on a Redis of the "
            f"bench's own; {args.rate:g} GET/s of steady load (one connection per request) "
            "through the edge. A trial kills -9 the agent of the worker running the app's "
            "machine and every machine process it started; *hit* requests are those in "
            "flight at the kill or sent in the 2 s after it; *added* is their latency over "
            "the trial's pre-kill median; *restored* is the time until the app has a started "
            "machine (and its spare) again on live workers, as placement's API reports "
            "them (a spare counts once its agent reports it; after the first trials every "
            "worker holds the image, so its pull takes milliseconds).\n\n"
            + table + "\n\nRolling deploys of a new image (3 started machines, "
            "strategy rolling) under the same load; seconds from the deploy call until every "
            "machine runs the new release:\n\n" + roll_table + "\n")
    print(body)
    if not args.no_write:
        write_section("failover", body)


def faults(args: argparse.Namespace, work: Path) -> None:
    build_image(HELLO, "hello:v1", layout=work / "v1")
    build_image(HELLO, "hello:v2", layout=work / "v2",
                overrides=BuildOverrides(env={"GREETING": "hi"}))
    images = {"v1": f"oci:{work / 'v1'}:v1", "v2": f"oci:{work / 'v2'}:v2"}
    only = set() if args.faults == "all" else set(args.faults.split(","))
    lines = run_faults(work, images, args.fault_trials, args.apps, args.rate, only,
                       lambda line: print(line, flush=True))
    command = (f"{COMMAND} --faults {args.faults} --fault-trials {args.fault_trials} "
               f"--apps {args.apps} --rate {args.rate:g}")
    body = (f"## The control plane's bad day (issue 25)\n\n`{command}`, {machine_line()}.\n\n"
            "Two placements on one PostgreSQL, two edges (each knowing both placements), "
            "three agents (heartbeat 1 s), one Redis, all separate processes; "
            f"{args.apps} idle apps present; {args.rate:g} GET/s of steady load on three "
            "warm apps (one machine each) during the Redis faults and on the deployed app. "
            "*failed*: requests not answered 200 (for redis-restart also each look at an "
            "edge's view that lacked an existing app); *recovery*: redis-stall from SIGCONT "
            "until placement lists every warm app's machine again, redis-restart until both "
            "edges' views and the registry hold every app again, placement-kill the two "
            "cold wakes' wall time, pg-stop how long the held create waited past the 20 s "
            "outage, deploy the whole rolling deploy; *fenced*: warm machines the "
            "reconciler fenced (app events); *destroyed*: warm machines gone after "
            "the fault; *duplicated*: machines beyond an app's shape (a deploy: new machines "
            "beyond one per old one); *leaked*: machines at an agent that placement does not "
            "list.\n\n" + "\n".join(lines) + "\n")
    print(body)
    if not args.no_write:
        write_section("faults", body)


if __name__ == "__main__":
    main()
