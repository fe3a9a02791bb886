"""The control plane's bad day as one table (issue 25): the faults an operator meets, each
tried `trials` times on one platform of separate processes — two placements on one
PostgreSQL, two edges (each knowing both placements), three agents, one Redis — with
`apps` idle apps present beside the ones each fault works on.

- redis-stall: Redis SIGSTOPped for 10 s, then SIGCONT, under steady load on 3 warm apps;
- redis-restart: Redis killed -9 and restarted empty on its port, the same load, and the
  edges' view of every app watched;
- placement-kill: one placement killed -9; a cold wake of a new app through each edge at
  once (then the placement is started again);
- pg-stop: PostgreSQL killed and started again 20 s later; meanwhile one wake per edge
  of an app with a spare, and one wake that needs a new machine (held until it is back);
- deploy: a rolling deploy of a 3-machine app under the same load.

Per fault: requests failed / total, recovery p50 / max, and the machines destroyed that
should have been kept, duplicated (beyond an app's shape) and leaked (at an agent, of no
app placement lists). Used by `loadtests/bench_failover.py --faults`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import redis as redis_py

from ground.registry import keys
from loadtests.bench_wakes import get_all, known
from loadtests.benchlib import median
from tests.support.agent_process import call, wait_until
from tests.support.credentials import ADMIN_TOKEN
from tests.support.load import SteadyLoad
from tests.support.postgres import PostgresServer
from tests.support.redis_server import start_redis_server
from tests.support.services import Services

GUEST = {"cpus": 0.05, "memory_mb": 32}
WARM = ("warm0", "warm1", "warm2")
STALL_S, PG_STOP_S = 10.0, 20.0


@dataclass
class Row:
    fault: str
    trials: int = 0
    failed: int = 0
    total: int = 0
    recovery_s: list[float] = field(default_factory=list)
    fenced: int = 0
    destroyed: int = 0
    duplicated: int = 0
    leaked: int = 0
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        rec = (f"{median(self.recovery_s):.2f} / {max(self.recovery_s):.2f}"
               if self.recovery_s else "-")
        return (f"| {self.fault} | {self.trials} | {self.failed} / {self.total} | {rec} | "
                f"{self.fenced} | {self.destroyed} | {self.duplicated} | {self.leaked} |")


HEADER = ["| fault | trials | failed / total | recovery s p50 / max | fenced | destroyed "
          "| duplicated | leaked |", "|---|---|---|---|---|---|---|---|"]
SETTLE_S = 35.0  # after a Redis fault: longer than a failure mark (30 s), whose end destroyed
# the machines it had fenced


class Platform:
    """The platform and what the faults need to reach: Redis (restartable in place),
    PostgreSQL, and the services."""

    def __init__(self, work: Path, image: str, apps: int) -> None:
        self.work, self.image, self.apps = work, image, apps
        self.stack = contextlib.ExitStack()
        self.pg = PostgresServer()
        self.redis_port = 0
        self.redis_pid = 0
        self.services: Services | None = None
        self.retried = 0  # creates answered 503 and tried again

    def __enter__(self) -> Platform:
        redis = self.stack.enter_context(start_redis_server())
        self.redis_port, self.redis_pid = redis.port, redis.pid
        self.pg.start()
        self.stack.callback(self.pg.stop)
        store = self.pg.create_database("thaw")
        self.services = Services(self.work, redis.url, agents=3, placements=2, edges=2,
                                 store=store, agent_cpus=8, agent_memory_mb=8192,
                                 heartbeat_s=1.0, every_placement=True)
        self.stack.callback(self.services.stop)
        self.services.start()
        wait_until(lambda: len(self.api("GET", "/v1/workers")[1]) == 3, 30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    @property
    def s(self) -> Services:
        assert self.services is not None
        return self.services

    def api(self, method: str, path: str, body: Any = None,
            placement: int = 0) -> tuple[int, Any]:
        return call(method, f"{self.s.apis[placement]}{path}", body, token=ADMIN_TOKEN)

    def create(self, name: str, placement: int = 0, **fields: Any) -> None:
        """Create an app (a 503 — the store busy — is tried again, up to 5 times)."""
        for attempt in range(5):
            status, body = self.api("POST", "/v1/apps", {
                "name": name, "image": self.image, "idle_timeout_s": 600, "guest": GUEST,
                **fields}, placement)
            if status == 201 or (status == 409 and attempt):  # made by a timed-out try
                return
            if status != 503:
                break
            self.retried += 1
            time.sleep(0.5 * (attempt + 1))
        raise SystemExit(f"create {name}: {status} {body}")

    def fill(self) -> None:
        """`apps` idle apps (no machine), created through both placements at once."""
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: self.create(f"idle{i}", i % 2), range(self.apps)))

    def machines(self, app: str) -> list[dict[str, Any]]:
        for placement in (0, 1):
            with contextlib.suppress(Exception):
                status, body = self.api("GET", f"/v1/apps/{app}/machines",
                                        placement=placement)
                if status == 200:
                    return [m for m in body if m["state"] not in ("destroying", "destroyed")]
        return []

    def at_agents(self) -> list[dict[str, Any]]:
        """Every machine the agents hold (not destroyed)."""
        found: list[dict[str, Any]] = []
        for i in range(self.s.agents):
            with contextlib.suppress(Exception):
                _, views = call("GET", f"http://127.0.0.1:{self.s.agent_ports[i]}/v1/machines")
                found += [v for v in views if v["state"] not in ("destroying", "destroyed")]
        return found

    def restart_redis(self) -> None:
        """kill -9 of Redis, and a new empty one on the same port."""
        os.kill(self.redis_pid, signal.SIGKILL)  # reaped when the stack closes
        wait_until(lambda: not port_open(self.redis_port), 10, 0.01)
        redis = self.stack.enter_context(start_redis_server(self.redis_port))
        self.redis_pid = redis.pid


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def started_ids(p: Platform, apps: tuple[str, ...]) -> dict[str, set[str]]:
    return {a: {m["id"] for m in p.machines(a) if m["state"] == "started"} for a in apps}


def kept(p: Platform, row: Row, before: dict[str, set[str]], since: float,
         want: int = 1) -> None:
    """Count machines of `before` no longer there, machines beyond `want` per app, and
    machines fenced (app events) since `since` (wall clock)."""
    after = {a: p.machines(a) for a in before}
    for app in before:
        events = answered(partial(p.api, "GET", f"/v1/apps/{app}/events"))
        row.fenced += sum(1 for e in events if e["action"] == "fence" and e["at"] >= since)
    for app, ids in before.items():
        now = {m["id"] for m in after[app]}
        row.destroyed += len(ids - now)
        row.duplicated += max(0, len(after[app]) - want)


def answered(ask: Callable[[], tuple[int, Any]], timeout_s: float = 60) -> Any:
    """The body of `ask()` once it answers 200 (placement may be busy after a fault)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status, body = ask()
        if status == 200 or time.monotonic() > deadline:
            return body
        time.sleep(0.5)


def leaks(p: Platform, row: Row) -> None:
    listed = {m["id"] for a in {v["app"] for v in p.at_agents()} for m in p.machines(a)}
    row.leaked += sum(1 for v in p.at_agents() if v["id"] not in listed)


@contextlib.contextmanager
def warm_load(p: Platform, rate: float) -> Iterator[list[SteadyLoad]]:
    loads = [SteadyLoad(p.s.edge_ports[i % 2], f"{app}.localhost", rate=rate / len(WARM),
                        clients=3) for i, app in enumerate(WARM)]
    with contextlib.ExitStack() as stack:
        for load in loads:
            stack.enter_context(load)
        yield loads


def count(row: Row, loads: list[SteadyLoad]) -> None:
    answers = [a for load in loads for a in load.answers]
    row.total += len(answers)
    row.failed += sum(1 for a in answers if a.status != 200)


def redis_stall(p: Platform, row: Row, rate: float) -> None:
    before, since = started_ids(p, WARM), time.time()
    with warm_load(p, rate) as loads:
        time.sleep(2.0)
        os.kill(p.redis_pid, signal.SIGSTOP)
        try:
            time.sleep(STALL_S)
        finally:
            os.kill(p.redis_pid, signal.SIGCONT)
        back = time.monotonic()
        wait_until(lambda: all(len(ids) == 1 for ids in started_ids(p, WARM).values()), 60)
        row.recovery_s.append(time.monotonic() - back)
        time.sleep(max(0.0, back + SETTLE_S - time.monotonic()))
    count(row, loads)
    kept(p, row, before, since)


def redis_restart(p: Platform, row: Row, rate: float) -> None:
    before, since = started_ids(p, WARM), time.time()
    names = [f"idle{i}" for i in range(p.apps)]
    missing: list[int] = []

    def view_short(edge: int) -> int:
        _, state = call("GET", f"http://127.0.0.1:{p.s.admin_ports[edge]}/v1/state")
        return sum(1 for n in names if n not in state["apps"])

    with warm_load(p, rate) as loads:
        time.sleep(2.0)
        p.restart_redis()
        back = time.monotonic()

        def whole() -> bool:
            short = max(view_short(0), view_short(1))
            missing.append(short)
            return short == 0 and apps_in_registry(p) >= p.apps + len(WARM)

        wait_until(whole, 120, 0.25)
        row.recovery_s.append(time.monotonic() - back)
        time.sleep(max(0.0, back + SETTLE_S - time.monotonic()))
    count(row, loads)
    if max(missing, default=0):
        row.notes.append(f"an edge's view lacked up to {max(missing)} apps")
    row.failed += sum(1 for n in missing if n)  # a probe of the view that lacked an app
    kept(p, row, before, since)


def apps_in_registry(p: Platform) -> int:
    client = redis_py.Redis(port=p.redis_port)
    try:
        return int(client.hlen(keys.apps()))
    finally:
        client.close()


def placement_kill(p: Platform, row: Row, trial: int) -> None:
    names = [f"pk{trial}e{e}" for e in (0, 1)]
    for name in names:
        p.create(name, 1)
    wait_until(lambda: all(known(p.s, e, n) for e in (0, 1) for n in names), 20, 0.05)
    proc = p.s.procs["placement"]
    proc.kill()
    proc.wait()
    began = time.monotonic()
    answers = asyncio.run(get_all([(p.s.edge_ports[e], f"{names[e]}.localhost", "/")
                                   for e in (0, 1)]))
    row.recovery_s.append(time.monotonic() - began)
    row.total += len(answers)
    row.failed += sum(1 for status, _, _ in answers if status != 200)
    p.s.restart("placement")
    for name in names:
        row.duplicated += max(0, len(p.machines(name)) - 1)
        p.api("DELETE", f"/v1/apps/{name}", placement=1)


def pg_stop(p: Platform, row: Row, trial: int) -> None:
    spares = [f"sp{trial}e{e}" for e in (0, 1)]
    fresh = f"new{trial}"
    for name in spares:
        p.create(name, spares=1, hold_timeout_s=60)
    p.create(fresh, hold_timeout_s=60)
    wait_until(lambda: all(len(p.machines(n)) == 1 for n in spares), 60)
    wait_until(lambda: all(known(p.s, e, n) for e in (0, 1) for n in [*spares, fresh]), 20)
    p.pg.kill()
    stopped = time.monotonic()
    try:
        targets = [(p.s.edge_ports[e], f"{spares[e]}.localhost", "/") for e in (0, 1)]
        targets.append((p.s.edge_ports[0], f"{fresh}.localhost", "/"))

        async def wakes() -> list[tuple[int, str, str]]:
            async def restart_later() -> None:
                await asyncio.sleep(max(0.0, stopped + PG_STOP_S - time.monotonic()))
                await asyncio.to_thread(p.pg.start)

            answers, _ = await asyncio.gather(get_all(targets), restart_later())
            return answers

        began = time.monotonic()
        answers = asyncio.run(wakes())
        took = time.monotonic() - began
    finally:
        if p.pg.pid is None:
            p.pg.start()
    row.total += len(answers)
    row.failed += sum(1 for status, _, _ in answers if status != 200)
    row.recovery_s.append(max(0.0, took - PG_STOP_S))  # the create's wait past the outage
    for name in [*spares, fresh]:
        row.duplicated += max(0, sum(1 for m in p.machines(name)
                                     if m["state"] == "started") - 1)
        p.api("DELETE", f"/v1/apps/{name}")


def deploy(p: Platform, row: Row, trial: int, rate: float, image_v2: str) -> None:
    name = f"roll{trial}"
    p.create(name, min_machines_running=3, max_machines=6,
             health={"path": "/healthz", "timeout_s": 5})
    wait_until(lambda: sum(m["state"] == "started" for m in p.machines(name)) == 3, 90)
    first = {m["id"] for m in p.machines(name)}
    seen: set[str] = set()

    def on_v2() -> bool:
        now = p.machines(name)
        seen.update(m["id"] for m in now)
        return len(now) == 3 and all(m["state"] == "started" and m["release"] == 2
                                     for m in now)

    load = SteadyLoad(p.s.edge_ports[0], f"{name}.localhost", rate=rate, clients=3)
    with load:
        time.sleep(1.0)
        began = time.monotonic()
        status, body = p.api("POST", f"/v1/apps/{name}/deploy", {"image": image_v2})
        assert status == 200, body
        wait_until(on_v2, 180, 0.1)
        row.recovery_s.append(time.monotonic() - began)
        time.sleep(1.0)
    count(row, [load])
    row.duplicated += max(0, len(seen - first) - 3)  # each old one replaced exactly once
    p.api("DELETE", f"/v1/apps/{name}")


def run_faults(work: Path, images: dict[str, str], trials: int, apps: int, rate: float,
               only: set[str], say: Callable[[str], None]) -> list[str]:
    rows = {name: Row(name) for name in
            ("redis-stall", "redis-restart", "placement-kill", "pg-stop", "deploy")
            if not only or name in only}
    with Platform(work, images["v1"], apps) as p:
        for app in WARM:
            p.create(app, min_machines_running=1)
        p.fill()
        if p.retried:
            say(f"{p.retried} creates were answered 503 and tried again")
        wait_until(lambda: all(len(p.machines(a)) == 1 for a in WARM), 90)
        wait_until(lambda: all(known(p.s, e, a) for e in (0, 1) for a in WARM), 20)
        for trial in range(trials):  # interleaved: one trial of each fault per round
            for name, row in rows.items():
                began = time.monotonic()
                if name == "redis-stall":
                    redis_stall(p, row, rate)
                elif name == "redis-restart":
                    redis_restart(p, row, rate)
                elif name == "placement-kill":
                    placement_kill(p, row, trial)
                elif name == "pg-stop":
                    pg_stop(p, row, trial)
                else:
                    deploy(p, row, trial, rate, images["v2"])
                row.trials += 1
                leaks(p, row)
                say(f"{name} trial {trial}: {row.line()} ({time.monotonic() - began:.0f} s)")
    lines = [*HEADER, *(row.line() for row in rows.values())]
    notes = [f"- {row.fault}: {note}" for row in rows.values() for note in row.notes]
    return lines + (["", *notes] if notes else [])
