"""Secrets end to end, every service its own process meeting in a real Redis: set with
the CLI -> a release rolled out -> the app sees the value in its environment; and no
answer, no CLI output, no SQLite file (WAL included), no agent op log, no log and no
Redis key or value holds it. The only places it is in clear on disk are the OCI
bundles' config.json (runc reads the environment there), which are 0600."""

from __future__ import annotations

import http.client
import json
import secrets
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.agent_process import call, wait_until
from tests.support.credentials import ADMIN_TOKEN
from tests.support.redis_server import RedisServer, start_redis_server
from tests.support.services import Services, app_machines
from thaw.imagebuild import build_image

pytestmark = [pytest.mark.slow, pytest.mark.integration]
PROBE = Path(__file__).resolve().parent / "apps" / "probe"


@pytest.fixture
def services(tmp_path: Path) -> Iterator[tuple[Services, RedisServer]]:
    with start_redis_server() as server:
        running = Services(tmp_path, server.url, agents=1).start()
        try:
            yield running, server
        finally:
            running.stop()


def thaw(services: Services, *args: str, stdin: str = "") -> str:
    done = subprocess.run([sys.executable, "-m", "thaw", *args, "--api", services.api,
                           "--token", ADMIN_TOKEN], input=stdin.encode(), capture_output=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode() + done.stderr.decode()


def environ_seen(services: Services) -> str:
    """The probe's /proc/self/environ, asked through the edge."""
    conn = http.client.HTTPConnection("127.0.0.1", services.edge_port, timeout=30)
    try:
        conn.request("GET", "/files?path=/proc/self/environ",
                     headers={"Host": "hello.localhost"})
        response = conn.getresponse()
        body = response.read().decode(errors="replace")
    finally:
        conn.close()
    return body if response.status == 200 else ""


def runs_release(services: Services, release: int) -> bool:
    machines = [m for m in app_machines(services) if m["state"] not in ("destroyed",)]
    return bool(machines) and all(m["release"] == release and m["state"] == "started"
                                  for m in machines)


def redis_contents(server: RedisServer) -> bytes:
    """Every key and every value in the Redis, whatever their types."""
    client = redis.Redis.from_url(server.url)
    read = {"string": client.get, "hash": client.hgetall, "set": client.smembers,
            "list": lambda k: client.lrange(k, 0, -1), "stream": client.xrange,
            "zset": lambda k: client.zrange(k, 0, -1, withscores=True)}
    out = []
    for key in client.scan_iter(count=1000):
        value = read[client.type(key).decode()](key)
        out.append(key + b"=" + repr(value).encode())
    client.close()
    assert out, "the registry's keys are in this Redis"
    return b"\n".join(out)


def files_holding(root: Path, needle: bytes) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if needle in path.read_bytes():
                    found.append(path)
            except OSError:
                pass  # sockets, vanished files
    return found


def test_a_secret_set_is_rolled_out_seen_by_the_app_and_held_in_clear_nowhere_else(
    services: tuple[Services, RedisServer], tmp_path: Path,
) -> None:
    running, server = services
    build_image(PROBE, "probe:v1", layout=tmp_path / "layout")
    wait_until(lambda: len(call("GET", f"{running.api}/v1/workers", token=ADMIN_TOKEN)[1])
               == 1, 20)
    status, body = call("POST", f"{running.api}/v1/apps", token=ADMIN_TOKEN, body={
        "name": "hello", "image": f"oci:{tmp_path / 'layout'}:v1", "min_machines_running": 1,
        "guest": {"cpus": 0.5, "memory_mb": 128}, "env": {"PLAIN": "visible-config"}})
    assert status == 201, body
    wait_until(lambda: runs_release(running, 1), 60)
    value = "s3cret-" + secrets.token_hex(16)

    said = thaw(running, "secrets", "set", "hello", "DB_PASSWORD=-", stdin=value + "\n")
    assert "release 2" in said and value not in said
    wait_until(lambda: runs_release(running, 2), 90)
    wait_until(lambda: f"DB_PASSWORD={value}" in environ_seen(running), 30)
    assert "PLAIN=visible-config" in environ_seen(running)

    shown = thaw(running, "secrets", "list", "hello") + thaw(running, "apps", "show", "hello") \
        + thaw(running, "apps", "show", "hello", "--json")
    assert "DB_PASSWORD" in shown and value not in shown
    answers = [call("GET", f"{running.api}{path}", token=ADMIN_TOKEN)[1] for path in (
        "/v1/apps", "/v1/apps/hello", "/v1/apps/hello/secrets", "/v1/apps/hello/releases",
        "/v1/apps/hello/events", "/v1/apps/hello/machines", "/v1/apps/hello/placements")]
    assert value not in json.dumps(answers)
    assert value.encode() not in redis_contents(server)
    assert files_holding(tmp_path / "placement", value.encode()) == []  # SQLite and WAL
    assert [p.name for p in (tmp_path / "placement").iterdir() if "sqlite3" in p.name]
    assert [p.name for p in tmp_path.glob("*.log")]
    assert files_holding(tmp_path, value.encode()) == [
        p for p in files_holding(tmp_path / "agent-0", value.encode())
        if p.name == "config.json"]  # the op log and the logs: sealed or absent
    for config in files_holding(tmp_path, value.encode()):
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        assert stat.S_IMODE(config.parent.stat().st_mode) == 0o700
    oplog = [p for p in (tmp_path / "agent-0").rglob("*") if p.is_file()
             and b"sealed_env" in p.read_bytes()]
    assert oplog, "the agent's op log records the sealed secrets"
