"""A stolen agent Redis user cannot route another app's traffic: every service its own
process, a real Redis locked with a user and ACL per role, the edge and placement with
a route key (ground/auth/tickets.py). The red team's attack — HSET a machine record with
an address of one's own and XADD the change, as the registry does — as a regression."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import msgspec
import pytest
import redis

from ground.registry import keys
from ground.registry.types import MachineRecord
from tests.e2e.test_services_redis import deploy_hello
from tests.support.agent_process import call, wait_until
from tests.support.credentials import ADMIN_TOKEN
from tests.support.redis_server import start_redis_server
from tests.support.services import Services, app_machines, edge_get

pytestmark = [pytest.mark.slow, pytest.mark.integration]


class Trap:
    """The attacker's listener on 127.0.0.1: counts every request that reaches it."""

    def __init__(self) -> None:
        trap = self
        self.hits = 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                trap.hits += 1
                body = b"hello from trap"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def trap() -> Iterator[Trap]:
    listener = Trap()
    try:
        yield listener
    finally:
        listener.close()


def forge(agent: redis.Redis, record: MachineRecord) -> None:
    """What the red team did: write the record into the app's hash and announce it on the
    change feed, as ground/registry/redis.py's put script does."""
    agent.hset(keys.machines(record.app), record.id, msgspec.json.encode(record))
    agent.xadd(keys.changes(), {"kind": "machine", "key": f"{record.app}/{record.id}"},
               maxlen=100_000, approximate=True)


def refused(services: Services) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", services.admin_port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("thaw_edge_machine_records_refused_total{"))


def test_an_agents_redis_user_cannot_route_another_workers_or_apps_machines_anywhere(
    tmp_path: Path, trap: Trap,
) -> None:
    with start_redis_server(locked=True, workers=("w0", "w1")) as locked:
        services = Services(tmp_path, "", locked=locked).start()
        agent: redis.Redis | None = None
        try:
            machine_id = deploy_hello(services, tmp_path)  # the normal path: sealed, served
            (real,) = [m for m in app_machines(services) if m["id"] == machine_id]
            other = "w1" if real["worker"] == "w0" else "w0"
            status, body = call("POST", f"{services.api}/v1/apps", token=ADMIN_TOKEN, body={
                "name": "idle", "image": f"oci:{tmp_path / 'layout'}:v1",
                "idle_timeout_s": 60, "guest": {"cpus": 0.5, "memory_mb": 128}})
            assert status == 201, body
            uid = body["uid"]
            agent = redis.Redis.from_url(locked.url_of(f"agent-{other}"))
            genuine = msgspec.json.decode(agent.hget(keys.machines("hello"), machine_id),
                                          type=MachineRecord)
            assert genuine.seal
            now = time.time() + 60  # newer than anything the real worker wrote
            attacks = [
                # the reroute: the real machine's own record, pointed at the attacker
                msgspec.structs.replace(genuine, address=trap.address, updated_at=now),
                # a machine of hello's invented on the attacker's own worker
                msgspec.structs.replace(genuine, id="f0f0f0f0f0f0f0", worker=other,
                                        address=trap.address, updated_at=now, seal=""),
                # another worker's seal, copied onto an app with no machine at all
                msgspec.structs.replace(genuine, app="idle", app_uid=uid, id="f1f1f1f1f1f1f1",
                                        address=trap.address, updated_at=now),
            ]
            for record in attacks:
                forge(agent, record)
            wait_until(lambda: refused(services) >= len(attacks), 10)
            for _ in range(20):
                status, body, _ = edge_get(services, "hello.localhost")
                assert status == 200 and body.split()[-1] == machine_id, body
            status, body, _ = edge_get(services, "idle.localhost")  # woken, not the trap
            assert status == 200 and body.startswith("hello from ")
            assert body.split()[-1] not in ("trap", "f1f1f1f1f1f1f1"), body
            assert trap.hits == 0
        finally:
            if agent is not None:
                agent.close()
            services.stop()
        logs = (tmp_path / "edge.log").read_text()
        assert "machine record refused (bad_seal): machine f0f0f0f0f0f0f0 of app hello " \
               f"on worker {other}" not in logs  # unsealed, said as such:
        assert f"machine record refused (no_seal): machine f0f0f0f0f0f0f0 of app hello on " \
               f"worker {other}" in logs, logs
