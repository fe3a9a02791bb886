"""Two placements, two edges and three agents as separate processes on one Redis and one
PostgreSQL: any placement serves any app, wakes are single-flight across placements, and
one placement at a time reconciles an app."""

from __future__ import annotations

import asyncio
import http.client
import math
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.agent_process import call, wait_until
from tests.support.credentials import ADMIN_TOKEN
from tests.support.postgres import running_postgres
from tests.support.redis_server import start_redis_server
from tests.support.services import Services, edge_get
from thaw.imagebuild import BuildOverrides, build_image

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ECHO = Path(__file__).parent / "apps" / "echo"
LEASE_TTL_S = 5.0  # placement's reconciler lease (placement/reconciling/reconciler.py)


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Services, str]]:
    tmp = tmp_path_factory.mktemp("many")
    build_image(ECHO, "echo:slowboot", layout=tmp / "layout", overrides=BuildOverrides(
        entrypoint=["python3", "app.py", "--boot-delay", "1"]))
    with start_redis_server() as redis, running_postgres() as postgres:
        services = Services(tmp, redis.url, agents=3, placements=2, edges=2,
                            store=postgres.url()).start()
        try:
            wait_until(lambda: len(call("GET", f"{services.api}/v1/workers",
                                        token=ADMIN_TOKEN)[1]) == 3, 20)
            yield services, f"oci:{tmp / 'layout'}:slowboot"
        finally:
            services.stop()


def create(services: Services, placement: int, name: str, image: str, **fields: Any) -> None:
    status, body = call("POST", f"{services.apis[placement]}/v1/apps", token=ADMIN_TOKEN,
                        body={"name": name, "image": image, "idle_timeout_s": 60,
                              "guest": {"cpus": 0.25, "memory_mb": 64}, **fields})
    assert status == 201, body


def live_machines(services: Services, app: str, placement: int = 0) -> list[dict[str, Any]]:
    status, body = call("GET", f"{services.apis[placement]}/v1/apps/{app}/machines",
                        token=ADMIN_TOKEN)
    assert status == 200, body
    return [m for m in body if m["state"] not in ("destroying", "destroyed")]


def edge_knows(services: Services, edge: int, app: str) -> bool:
    _, state = call("GET", f"http://127.0.0.1:{services.admin_ports[edge]}/v1/state")
    return app in state["apps"]


def reconciler_actions(services: Services, placement: int) -> dict[str, int]:
    """app -> reconciler actions this placement took on it (its /metrics)."""
    name = "placement" if placement == 0 else f"placement-{placement}"
    if services.procs[name].poll() is not None:
        return {}
    status, text = call("GET", f"{services.placement_admins[placement]}/metrics")
    assert status == 200
    counts: dict[str, int] = {}
    for app, value in re.findall(r'^thaw_placement_reconciler_actions_total\{[^}]*app="([^"]+)"'
                                 r'[^}]*\} ([0-9.e+]+)$', str(text), re.M):
        counts[app] = counts.get(app, 0) + int(float(value))
    return counts


def test_an_app_created_through_one_placement_is_served_through_the_other_edge(
    platform: tuple[Services, str],
) -> None:
    services, image = platform
    create(services, 0, "across", image)
    status, body = call("GET", f"{services.apis[1]}/v1/apps/across", token=ADMIN_TOKEN)
    assert status == 200 and body["name"] == "across", body  # one store
    wait_until(lambda: edge_knows(services, 1, "across"), 5, 0.05)  # within a second or so
    status, body, _ = edge_get(services, "across.localhost", edge=1)
    assert status == 200 and body.startswith("echo "), body


def test_a_burst_of_200_split_across_two_edges_starts_exactly_ceil_200_over_soft_limit(
    platform: tuple[Services, str],
) -> None:
    services, image = platform
    create(services, 1, "burst", image, max_machines=12,
           concurrency={"type": "requests", "soft_limit": 25, "hard_limit": 30})
    wait_until(lambda: edge_knows(services, 0, "burst") and edge_knows(services, 1, "burst"),
               5, 0.05)

    async def burst() -> list[int]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            async def one(edge: int) -> int:
                async with session.get(
                    f"http://127.0.0.1:{services.edge_ports[edge]}/slow?s=2",
                    headers={"Host": "burst.localhost"},
                ) as response:
                    await response.read()
                    return response.status

            return await asyncio.gather(*(one(i % 2) for i in range(200)))

    # Each request stays 2 s at its machine, so all 200 are in flight together even when a
    # loaded machine takes a second or more to open the 200 connections (with 0.3 s the
    # first answers freed room before the last arrived, and 4 machines were enough).
    assert asyncio.run(burst()) == [200] * 200
    # Exactly what the burst needs: the two placements' wakes are planned one after the
    # other with each other's claims (without them each edge's wakes start their own), and
    # sized from both edges' demand (without it each edge counts the machines the other's
    # wakes started as its own capacity, and together they start too few), and each edge
    # asks again when the machines are full of the other's requests too (counting only its
    # own, each found 5 machines enough for its 100 and held the rest: 5 != 8 once in CI).
    assert len(live_machines(services, "burst")) == math.ceil(200 / 25)


def slow_get(services: Services, edge: int, host: str, seconds: float) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", services.edge_ports[edge], timeout=30)
    try:
        conn.request("GET", f"/slow?s={seconds}", headers={"Host": host})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_a_machine_full_from_one_edge_takes_no_more_from_the_other_until_it_has_room(
    platform: tuple[Services, str],
) -> None:
    services, image = platform
    create(services, 0, "shared", image, min_machines_running=1, max_machines=1,
           concurrency={"type": "requests", "soft_limit": 1, "hard_limit": 2})

    def machine_seen(edge: int) -> dict[str, Any] | None:
        _, state = call("GET", f"http://127.0.0.1:{services.admin_ports[edge]}/v1/state")
        machines = state["apps"].get("shared", {}).get("machines", [])
        started = [m for m in machines if m["state"] == "started"]
        return started[0] if started else None

    wait_until(lambda: machine_seen(0) is not None and machine_seen(1) is not None, 30, 0.1)
    with ThreadPoolExecutor(3) as pool:
        busy = [pool.submit(slow_get, services, 0, "shared.localhost", 3) for _ in range(2)]
        # edge 1 counts edge 0's two requests at the machine (shared through Redis)...
        wait_until(lambda: (machine_seen(1) or {}).get("elsewhere") == 2, 5, 0.05)
        late = pool.submit(slow_get, services, 1, "shared.localhost", 0)
        # ...so at hard_limit 2 its own request is held, not sent to the machine
        wait_until(lambda: call("GET", f"http://127.0.0.1:{services.admin_ports[1]}"
                                "/v1/state")[1]["apps"]["shared"]["held"] == 1, 5, 0.05)
        assert not late.done()
        assert [f.result() for f in busy] == [200, 200]
        assert late.result() == 200  # released once edge 0's requests made room


def test_killing_the_reconciling_placement_hands_its_apps_to_the_other_within_the_ttl(
    platform: tuple[Services, str],
) -> None:
    services, image = platform
    apps = [f"keep{i}" for i in range(4)]
    for i, app in enumerate(apps):
        create(services, i % 2, app, image, min_machines_running=1)
    wait_until(lambda: all(len(live_machines(services, a)) == 1 for a in apps), 30, 0.2)
    time.sleep(1.0)  # a few passes more: nobody acts on an app that has what it declares
    before = [reconciler_actions(services, p) for p in (0, 1)]
    for app in apps:  # one placement acted on each app, never both
        assert (before[0].get(app, 0) > 0) != (before[1].get(app, 0) > 0), (app, before)
    holder = 0 if before[0].get(apps[0], 0) else 1
    survivor = 1 - holder
    name = "placement" if holder == 0 else f"placement-{holder}"
    services.procs[name].kill()  # kill -9: its leases lapse, nobody hands them over
    services.procs[name].wait()
    lost = [a for a in apps if before[holder].get(a, 0)]
    for app in lost:  # what the dead one reconciled now needs reconciling again
        machine = live_machines(services, app, survivor)[0]
        status, body = call("DELETE", f"{services.apis[survivor]}/v1/apps/{app}/machines/"
                            f"{machine['id']}", token=ADMIN_TOKEN)
        assert status in (200, 202), body
    killed_at = time.monotonic()
    wait_until(lambda: all(
        [m["state"] for m in live_machines(services, a, survivor)] == ["started"]
        for a in lost), LEASE_TTL_S + 15, 0.2)
    took_over_s = time.monotonic() - killed_at
    after = reconciler_actions(services, survivor)
    assert all(after.get(a, 0) > before[survivor].get(a, 0) for a in lost), (after, before)
    assert took_over_s < LEASE_TTL_S + 15
