"""A registry stall is not a death: Redis frozen 10 s (SIGSTOP) under warm load.

Every service as its own process on a real Redis. When the registry answers again,
every heartbeat looks lapsed (and Redis expires the workers' keys at once) until the
agents heartbeat again; the workers must be judged in doubt, not failed
(placement/core/liveness.py): no machine fenced or destroyed, none made, no warm
request failed. An agent's pending heartbeat often lands the moment Redis resumes,
which would hide the fault; so the agents (not their machines) are frozen too from
just before Redis resumes until `AGENTS_LATE_S` after (agents whose Redis clients are
still backing off), and every app is given a pass in that window (a config change).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.agent_process import call, wait_until
from tests.support.credentials import ADMIN_TOKEN
from tests.support.load import SteadyLoad
from tests.support.redis_server import RedisServer
from tests.support.services import Services
from thaw.imagebuild import build_image

pytestmark = [pytest.mark.slow, pytest.mark.integration]

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"
APPS = ("stall-a", "stall-b", "stall-c")
STALL_S = 10.0
AGENTS_LATE_S = 2.0  # under the 3 s heartbeat freshness: nobody may be failed for it
AFTER_S = 10.0
MARK_S = 10.0  # a failure mark (30 s by default): the take-back test waits it out


@pytest.fixture
def services(tmp_path: Path, redis_own: RedisServer) -> Iterator[Services]:
    with Services(tmp_path, redis_own.url, agents=3, heartbeat_s=0.5,
                  placement_args=("--failed-mark-s", str(MARK_S))) as running:
        yield running


def machines(services: Services, app: str) -> list[dict[str, Any]]:
    status, body = call("GET", f"{services.api}/v1/apps/{app}/machines", token=ADMIN_TOKEN)
    assert status == 200, body
    return body  # type: ignore[no-any-return]


def started(services: Services, app: str) -> set[str]:
    return {m["id"] for m in machines(services, app) if m["state"] == "started"}


def on_agents(services: Services, app: str) -> dict[str, str]:
    """Every machine of `app` the agents hold, by id -> state (the agents' own word)."""
    held: dict[str, str] = {}
    for _, port in (services.args[f"agent-{i}"] for i in range(services.agents)):
        _, views = call("GET", f"http://127.0.0.1:{port}/v1/machines?app={app}")
        held.update((v["id"], v["state"]) for v in views)
    return held


def events(services: Services, app: str) -> list[dict[str, Any]]:
    status, body = call("GET", f"{services.api}/v1/apps/{app}/events", token=ADMIN_TOKEN)
    assert status == 200, body
    return body  # type: ignore[no-any-return]


def test_a_10_s_redis_stall_under_warm_load_fences_destroys_and_fails_nothing(
    services: Services, tmp_path: Path, redis_own: RedisServer
) -> None:
    build_image(HELLO, "hello:v1", layout=tmp_path / "layout")
    wait_until(lambda: len(call("GET", f"{services.api}/v1/workers",
                                token=ADMIN_TOKEN)[1]) == 3, 30)
    for app in APPS:
        status, body = call("POST", f"{services.api}/v1/apps", token=ADMIN_TOKEN, body={
            "name": app, "image": f"oci:{tmp_path / 'layout'}:v1", "idle_timeout_s": 300,
            "min_machines_running": 1, "max_machines": 2,
            "guest": {"cpus": 0.25, "memory_mb": 64}})
        assert status == 201, body
    wait_until(lambda: all(len(started(services, app)) == 1 for app in APPS), 90)
    before = {app: started(services, app) for app in APPS}
    held_before = {app: on_agents(services, app) for app in APPS}
    events_before = {app: len(events(services, app)) for app in APPS}
    loads = [SteadyLoad(services.edge_port, f"{app}.localhost", rate=10, clients=2)
             for app in APPS]
    for load in loads:
        load.__enter__()
    try:
        # warm first: every app answers through the edge before the stall
        wait_until(lambda: all(any(a.status == 200 for a in load.answers) for load in loads),
                   30)
        since = time.monotonic()
        agents = [services.procs[f"agent-{i}"].pid for i in range(services.agents)]
        os.kill(redis_own.pid, signal.SIGSTOP)
        try:
            time.sleep(STALL_S - 1.0)
            for pid in agents:
                os.kill(pid, signal.SIGSTOP)
            time.sleep(1.0)
        finally:
            os.kill(redis_own.pid, signal.SIGCONT)
        try:
            back = time.monotonic()
            for app in APPS:  # a pass over every app while the heartbeats look lapsed
                status, body = call("PATCH", f"{services.api}/v1/apps/{app}",
                                    token=ADMIN_TOKEN, body={"idle_timeout_s": 301})
                assert status == 200, body
            time.sleep(max(0.0, back + AGENTS_LATE_S - time.monotonic()))
        finally:
            for pid in agents:
                os.kill(pid, signal.SIGCONT)
        time.sleep(AFTER_S)
    finally:
        for load in loads:
            load.__exit__()
    for app, load in zip(APPS, loads, strict=True):
        answers = load.between(since)
        failed = [a for a in answers if a.status != 200 or not a.body.startswith("hello from ")]
        assert answers and not failed, (app, len(answers), failed[:3])
        assert {a.body.split()[-1] for a in answers} == before[app]
    for app in APPS:
        assert started(services, app) == before[app], app
        assert on_agents(services, app) == held_before[app], app  # none made, none destroyed
        news = events(services, app)[: len(events(services, app)) - events_before[app]]
        acted = [e for e in news if e["action"] in ("fence", "destroy", "create", "replace")]
        assert not acted, (app, acted)


def suspect(services: Services, worker: str, reporter: str, machine: str) -> dict[str, Any]:
    status, body = call("POST", f"{services.api}/internal/workers/{worker}/suspect",
                        {"reporter": reporter, "machine": machine,
                         "address": "127.0.0.1:1", "error": "ConnectionRefusedError(111)"})
    assert status == 200, body
    return body  # type: ignore[no-any-return]


def test_machines_fenced_on_edges_reports_are_taken_back_when_the_mark_ends_same_epoch(
    services: Services, tmp_path: Path, redis_own: RedisServer
) -> None:
    """Two edges' reports fail a worker whose agent answers (its machines refused their
    connects): its machine is fenced and replaced, but not destroyed; when the mark runs
    out (MARK_S) with the worker under the same epoch, it is taken back and the surplus
    (max_machines=1) trimmed to one machine."""
    build_image(HELLO, "hello:v1", layout=tmp_path / "layout")
    wait_until(lambda: len(call("GET", f"{services.api}/v1/workers",
                                token=ADMIN_TOKEN)[1]) == 3, 30)
    status, body = call("POST", f"{services.api}/v1/apps", token=ADMIN_TOKEN, body={
        "name": "back", "image": f"oci:{tmp_path / 'layout'}:v1", "idle_timeout_s": 300,
        "min_machines_running": 1, "max_machines": 1,
        "guest": {"cpus": 0.25, "memory_mb": 64}})
    assert status == 201, body
    wait_until(lambda: len(started(services, "back")) == 1, 90)
    [first] = [m for m in machines(services, "back") if m["state"] == "started"]
    assert suspect(services, first["worker"], "edge-a", first["id"])["failed"] is False
    answer = suspect(services, first["worker"], "edge-b", "another")
    assert answer["failed"] is True and "two edges" in answer["reason"], answer

    def actions(action: str) -> list[dict[str, Any]]:
        return [e for e in events(services, "back")
                if e["action"] == action and e["machine"] == first["id"]]

    wait_until(lambda: actions("fence"), 30)
    # the mark lasts MARK_S (under the 30 s default: the flag is what ends it)
    wait_until(lambda: actions("unfence"), MARK_S + 15, 0.5)
    assert "same epoch" in actions("unfence")[0]["reason"]
    assert not [e for e in actions("destroy") if "lost" in e["reason"]]
    # the machine never stopped on its agent; one of the two is trimmed as a surplus
    wait_until(lambda: len([s for s in on_agents(services, "back").values()
                            if s == "started"]) == 1, 60, 0.5)
    if first["id"] in started(services, "back"):  # it was kept: edges route to it again
        fresh = redis.Redis.from_url(redis_own.url)
        record = json.loads(fresh.hget("thaw:machines:back", first["id"]) or b"{}")
        assert record.get("state") == "started" and record.get("address"), record
