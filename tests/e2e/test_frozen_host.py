"""A frozen host (its agent and its machines SIGSTOPped, the registry healthy): requests
held inside it go out again instead of hanging for the whole freeze.

A frozen machine's kernel still accepts connections and takes requests; no answer and
no reset come. Its worker's heartbeats stop while the registry answers, so it is failed
(placement/core/liveness.py) once its agent does not answer a probe either; its machine
is fenced and published `lost`; the edge then cuts its connections to it, and a request
that got no byte of an answer goes out again — to the app's spare, started meanwhile.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agent_process import call, find_machine_processes, wait_until
from tests.support.credentials import ADMIN_TOKEN
from tests.support.load import SteadyLoad
from tests.support.redis_server import start_redis_server
from tests.support.services import Services, app_machines
from thaw.imagebuild import build_image

pytestmark = [pytest.mark.slow, pytest.mark.integration]

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"
FREEZE_S = 15.0


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    with start_redis_server() as redis_own:
        running = Services(tmp_path, redis_own.url, agents=2, heartbeat_s=0.5).start()
        try:
            yield running
        finally:
            running.stop()


def freeze(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def test_requests_inside_a_frozen_host_go_out_again_before_it_thaws(
    services: Services, tmp_path: Path
) -> None:
    build_image(HELLO, "hello:v1", layout=tmp_path / "layout")
    wait_until(lambda: len(call("GET", f"{services.api}/v1/workers",
                                token=ADMIN_TOKEN)[1]) == 2, 30)
    status, body = call("POST", f"{services.api}/v1/apps", token=ADMIN_TOKEN, body={
        "name": "icy", "image": f"oci:{tmp_path / 'layout'}:v1", "idle_timeout_s": 300,
        "min_machines_running": 1, "spares": 1, "max_machines": 3,
        "guest": {"cpus": 0.25, "memory_mb": 64}})
    assert status == 201, body

    def shaped() -> bool:
        found = app_machines(services, "icy")
        return (sorted(m["state"] for m in found) == ["created", "started"]
                and len({m["worker"] for m in found}) == 2)

    wait_until(shaped, 90)
    [victim] = [m for m in app_machines(services, "icy") if m["state"] == "started"]
    index = int(victim["worker"][1:])
    agent_dir = tmp_path / f"agent-{index}"
    frozen = [services.procs[f"agent-{index}"].pid,
              *find_machine_processes({p.name for p in agent_dir.glob("machines/*")})]
    with SteadyLoad(services.edge_port, "icy.localhost", rate=20, clients=4) as load:
        wait_until(lambda: any(a.status == 200 for a in load.answers), 30)
        froze = time.monotonic()
        freeze(frozen, signal.SIGSTOP)
        try:
            time.sleep(FREEZE_S)
        finally:
            thawed = time.monotonic()
            freeze(frozen, signal.SIGCONT)
        time.sleep(2.0)
    during = [a for a in load.answers if froze <= a.started < thawed - 5.0]
    assert during, "no request was sent during the freeze"
    failed = [a for a in during if a.status != 200]
    assert not failed, failed[:3]
    # every request sent into the freeze was answered while the host was still frozen
    # (none waited for it to thaw): by the spare, started on the other worker
    late = [a for a in during if a.started + a.seconds >= thawed]
    assert not late, [(round(a.started - froze, 2), round(a.seconds, 2)) for a in late[:5]]
    assert {a.body.split()[-1] for a in during[-5:]} != {victim["id"]}
