"""Wakes survive a missing control plane part (issue 25): two placements on one
PostgreSQL, two edges each given both placements, agents, all separate processes on a
real Redis. A placement killed -9 costs a cold wake one refused attempt (the edge asks the
other); a stalled PostgreSQL (SIGSTOP of the server and its backends) leaves wakes that
can start an existing stopped machine or spare to succeed from the config in the shared
view, and holds a wake that must create a machine until it is back."""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent_process import call, wait_until
from tests.support.credentials import ADMIN_TOKEN
from tests.support.postgres import PostgresServer, running_postgres
from tests.support.redis_server import start_redis_server
from tests.support.services import Services
from thaw.imagebuild import build_image

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ECHO = Path(__file__).parent / "apps" / "echo"
STALL_S = 20.0
HOLD_S = 40.0  # every app's hold budget: a create held through the stall still has time


@pytest.fixture
def image(tmp_path: Path) -> str:
    """The echo app, in a layout the placements allow (under their tmp dir)."""
    build_image(ECHO, "echo:failover", layout=tmp_path / "layout")
    return f"oci:{tmp_path / 'layout'}:failover"


@pytest.fixture
def platform(tmp_path: Path, image: str,
             request: pytest.FixtureRequest) -> Iterator[tuple[Services, PostgresServer]]:
    """Each edge given both placements; with the parameter "discovered", only its own
    (it finds the other in the registry)."""
    given = getattr(request, "param", "given")
    with start_redis_server() as redis, running_postgres() as postgres:
        services = Services(tmp_path, redis.url, agents=2, placements=2, edges=2,
                            store=postgres.url(), every_placement=given == "given")
        try:
            services.start()
            wait_until(lambda: len(call("GET", f"{services.api}/v1/workers",
                                        token=ADMIN_TOKEN)[1]) == 2, 30)
            yield services, postgres
        finally:
            postgres.resume()  # frozen backends would outlive the server
            services.stop()


def create(services: Services, placement: int, name: str, image: str,
           **fields: Any) -> None:
    status, body = call("POST", f"{services.apis[placement]}/v1/apps", token=ADMIN_TOKEN,
                        body={"name": name, "image": image, "idle_timeout_s": 300,
                              "hold_timeout_s": HOLD_S,
                              "guest": {"cpus": 0.25, "memory_mb": 64}, **fields})
    assert status == 201, body


def get(services: Services, app: str, edge: int) -> tuple[int, str]:
    """GET / of `app` through edge `edge`, waiting past the hold budget."""
    conn = http.client.HTTPConnection("127.0.0.1", services.edge_ports[edge],
                                      timeout=HOLD_S + 30)
    try:
        conn.request("GET", "/", headers={"Host": f"{app}.localhost"})
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


def machines(services: Services, app: str) -> list[dict[str, Any]]:
    status, body = call("GET", f"{services.api}/v1/apps/{app}/machines", token=ADMIN_TOKEN)
    assert status == 200, body
    return [m for m in body if m["state"] not in ("destroying", "destroyed")]


def edges_know(services: Services, apps: list[str]) -> bool:
    for admin in services.admin_ports:
        _, state = call("GET", f"http://127.0.0.1:{admin}/v1/state")
        if not set(apps) <= set(state["apps"]):
            return False
    return True


def placements_known(services: Services, edge: int) -> int:
    _, state = call("GET", f"http://127.0.0.1:{services.admin_ports[edge]}/v1/state")
    places = state["placements"]
    return len(set(places["given"]) | set(places["discovered"]))


@pytest.mark.parametrize("platform", ["given", "discovered"], indirect=True)
def test_one_of_two_placements_killed_cold_wakes_through_every_edge_succeed(
        platform: tuple[Services, PostgresServer], image: str) -> None:
    services, _ = platform
    apps = [f"cold{i}" for i in range(6)]
    for i, app in enumerate(apps):
        create(services, i % 2, app, image)
    wait_until(lambda: edges_know(services, apps), 30)
    # given, or discovered from the placements' sealed adverts (every 5 s)
    wait_until(lambda: all(placements_known(services, e) == 2 for e in range(2)), 30)
    assert all(not machines(services, app) for app in apps)  # cold: never woken
    killed = services.procs["placement-1"]
    killed.kill()  # kill -9: edge 1 asks it first (its own), and gets refused
    killed.wait()
    with ThreadPoolExecutor(len(apps)) as pool:
        answers = list(pool.map(lambda i: get(services, apps[i], i % 2), range(len(apps))))
    assert [status for status, _ in answers] == [200] * len(apps), answers
    # and again through the edge whose first placement is the dead one, for every app
    with ThreadPoolExecutor(len(apps)) as pool:
        again = list(pool.map(lambda app: get(services, app, 1), apps))
    assert [status for status, _ in again] == [200] * len(apps), again


def test_postgres_stalled_20s_known_apps_wake_and_a_create_waits_for_it(
        platform: tuple[Services, PostgresServer], image: str) -> None:
    services, postgres = platform
    create(services, 0, "stopped", image)
    create(services, 1, "spare", image, spares=1)
    create(services, 0, "fresh", image)
    apps = ["stopped", "spare", "fresh"]
    wait_until(lambda: edges_know(services, apps), 30)
    # "stopped": woken once, then its machine stopped
    assert get(services, "stopped", 0)[0] == 200
    (machine,) = machines(services, "stopped")
    status, body = call("POST", f"{services.api}/v1/apps/stopped/machines/{machine['id']}/stop",
                        token=ADMIN_TOKEN)
    assert status == 200, body
    wait_until(lambda: [m["state"] for m in machines(services, "stopped")] == ["stopped"], 60)
    # "spare": its standby made (created, never started)
    wait_until(lambda: [m["state"] for m in machines(services, "spare")] == ["created"], 60)
    assert not machines(services, "fresh")

    postgres.pause()
    stalled_at = time.monotonic()
    with ThreadPoolExecutor(3) as pool:
        fresh = pool.submit(get, services, "fresh", 1)  # needs a new machine: held
        known = [pool.submit(get, services, "stopped", 1), pool.submit(get, services, "spare", 0)]
        # answered while PostgreSQL is still stopped (it is resumed only after these)
        answers = [f.result() for f in known]
        assert [status for status, _ in answers] == [200, 200], answers
        time.sleep(max(0.0, STALL_S - (time.monotonic() - stalled_at)))
        postgres.resume()
        status, text = fresh.result()
    assert status == 200, text
    assert "started" in {m["state"] for m in machines(services, "fresh")}
    assert "started" in {m["state"] for m in machines(services, "stopped")}
