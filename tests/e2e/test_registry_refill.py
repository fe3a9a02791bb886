"""Redis restarted empty under a platform of ~200 apps: every service as its own process
on a real Redis. While Redis is killed and comes back empty, apps are probed through the
edge without pause: warm ones answer 200, apps without machines never 404 (the edge keeps
its view until placement says the registry is filled again); afterwards every app is
back in the registry, the edge's view is authoritative again, and each app with
`min_machines_running = 1` has exactly the one machine it had (none made twice while the
agents had not yet published theirs again), counted at the agents."""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from ground.registry import keys
from tests.support.agent_process import call, kill_group, wait_until
from tests.support.credentials import ADMIN_TOKEN
from tests.support.load import SteadyLoad
from tests.support.redis_server import RedisServer, start_redis_server
from tests.support.services import Services, app_machines, edge_get
from thaw.imagebuild import build_image

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(600)]

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"
WARM = [f"warm{n}" for n in range(4)]
IDLE = [f"idle{n:03d}" for n in range(196)]
SLOW_AGENT_S = 8.0  # past the old fixed waits (the reconciler's 2 heartbeat freshnesses)


@pytest.fixture
def services(tmp_path: Path, redis_own: RedisServer) -> Iterator[Services]:
    with Services(tmp_path, redis_own.url) as running:
        yield running


@dataclass
class Prober:
    """Asks the edge for each app in `hosts` in turn, without pause, from one thread;
    every (host, status, error code) recorded."""

    port: int
    hosts: list[str]
    seen: list[tuple[str, int, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Prober:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _run(self) -> None:
        at = 0
        while not self._stop.is_set():
            host = self.hosts[at % len(self.hosts)]
            at += 1
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                conn.request("GET", "/", headers={"Host": host})
                response = conn.getresponse()
                body = response.read()
                self.seen.append((host, response.status, error_code(body)))
            except (OSError, http.client.HTTPException) as exc:
                self.seen.append((host, 0, repr(exc)))
            finally:
                conn.close()


def error_code(body: bytes) -> str:
    """The `error` of an edge's JSON error body ("" when there is none)."""
    try:
        found = json.loads(body)
    except ValueError:
        return ""
    return str(found.get("error", "")) if isinstance(found, dict) else ""


def authoritative(services: Services, fresh: redis.Redis) -> bool:
    """The edge's view follows the current generation and is no longer kept whole."""
    registry = edge_view(services)["registry"]
    return bool(not registry["rebuilding"]
                and registry["generation"] == fresh.get(keys.generation()))


def create(services: Services, name: str, layout: Path, **fields: Any) -> None:
    status, body = call("POST", f"{services.api}/v1/apps", token=ADMIN_TOKEN, body={
        "name": name, "image": f"oci:{layout}:v1", "idle_timeout_s": 600,
        "guest": {"cpus": 0.25, "memory_mb": 64}, **fields})
    assert status == 201, body


def edge_view(services: Services) -> dict[str, Any]:
    status, state = call("GET", f"http://127.0.0.1:{services.admin_port}/v1/state")
    assert status == 200, state
    return state  # type: ignore[no-any-return]


def test_redis_restarted_empty_with_200_apps_loses_no_app_and_makes_no_machine_twice(
    services: Services, tmp_path: Path, redis_own: RedisServer
) -> None:
    layout = tmp_path / "layout"
    build_image(HELLO, "hello:v1", layout=layout)
    wait_until(lambda: len(call("GET", f"{services.api}/v1/workers",
                                token=ADMIN_TOKEN)[1]) == 2, 20)
    for name in WARM:
        create(services, name, layout, min_machines_running=1)
    for name in IDLE:  # no machine, and none made by a probe: the edge answers 503
        create(services, name, layout, auto_start=False)

    def warm_up() -> bool:
        return all(any(m["state"] == "started" for m in app_machines(services, name))
                   for name in WARM)

    wait_until(warm_up, 120, interval_s=0.5)
    wait_until(lambda: all(edge_get(services, f"{n}.localhost")[0] == 200 for n in WARM), 60)
    wait_until(lambda: len(edge_view(services)["apps"]) == len(WARM) + len(IDLE), 30)
    before = services.machines_at_agents()
    assert before == Counter(WARM), before
    workers = {m["worker"] for name in WARM for m in app_machines(services, name)}
    assert workers == {"w0", "w1"}, workers  # the slow agent below has some of them
    slow = services.procs["agent-1"]

    loads = [SteadyLoad(services.edge_port, f"{name}.localhost", rate=10, clients=2)
             for name in WARM]
    prober = Prober(services.edge_port, [f"{name}.localhost" for name in IDLE])
    fresh = redis.Redis.from_url(redis_own.url, decode_responses=True)
    # (probes end before the restarted Redis does)
    with contextlib.ExitStack() as restarted, contextlib.ExitStack() as probing:
        probing.enter_context(prober)
        for load in loads:
            probing.enter_context(load)
        time.sleep(1.0)
        # One agent is slow to publish again (paused; its machines run on): until it has,
        # its machines are missing from the view, and an app with one there looks to
        # have none running.
        slow.send_signal(signal.SIGSTOP)
        try:
            kill_group(redis_own.pid)
            time.sleep(1.0)
            restarted.enter_context(start_redis_server(port=redis_own.port))
            back = time.monotonic()
            wait_until(lambda: fresh.hlen(keys.apps()) == len(WARM) + len(IDLE), 60)
            apps_back_s = time.monotonic() - back
            time.sleep(SLOW_AGENT_S)
            assert not authoritative(services, fresh)  # the slow agent is awaited
        finally:
            slow.send_signal(signal.SIGCONT)
        wait_until(lambda: authoritative(services, fresh), 90, interval_s=0.1)
        view_back_s = time.monotonic() - back
        assert fresh.get(keys.republished()) == fresh.get(keys.generation())
        time.sleep(3.0)  # probes after the first authoritative load too
        time.sleep(6.0)  # a timer pass of the reconciler over every app, after the refill
        in_registry = set(fresh.hkeys(keys.apps()))
        records = {name: fresh.hlen(keys.machines(name)) for name in WARM}
        after = services.machines_at_agents()
    fresh.close()
    print(f"\nRedis restarted empty with {len(WARM) + len(IDLE)} apps: every app back in "
          f"the registry in {apps_back_s:.2f} s, the edge's view authoritative again in "
          f"{view_back_s:.2f} s; {len(prober.seen)} probes of idle apps, "
          f"{sum(len(load.answers) for load in loads)} warm requests")

    idle = Counter((status, code) for _, status, code in prober.seen)
    assert set(idle) == {(503, "auto_start_off")}, idle
    for load in loads:
        warm = Counter(a.status for a in load.answers)
        assert set(warm) == {200}, (load.host, warm)
    assert in_registry == set(WARM) | set(IDLE)
    assert records == dict.fromkeys(WARM, 1), records
    assert after == before, after  # one machine each, and none made twice
    assert view_back_s < 60  # generous: the figure is the benchmark's (bench_refill.py)
