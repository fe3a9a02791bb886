"""A locked Redis (a password for every user, an ACL per role from ground/registry/acl.py):
each role does its work with its own user and nothing more; a service given a wrong
password or another role's user says so at start and exits non-zero."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.exceptions import NoPermissionError, ResponseError

from edge.adapters.loadboard import RedisLoadBoard
from ground.appconfig import AppConfig
from ground.registry.access import RegistryRefused, check_access
from ground.registry.redis import RedisRegistry
from ground.registry.types import MachineRecord, PlacementAdvert, WorkerStatus
from placement.adapters.coordination import RedisCoordination
from placement.core.claims import Claims
from tests.support.credentials import ENV
from tests.support.lease_watch import released_heard
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer, start_redis_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def locked() -> Iterator[RedisServer]:
    with start_redis_server(locked=True, workers=("w1",)) as server:
        yield server


@pytest.fixture(scope="module")
def locked_tls() -> Iterator[RedisServer]:
    with start_redis_server(locked=True, workers=("w1",), tls=True) as server:
        yield server


def machine(app: str, worker: str, at: float) -> MachineRecord:
    return MachineRecord(id=f"m-{app}", app=app, worker=worker, region="local",
                         state="started", image_digest="sha256:" + "a" * 64, created_at=at,
                         updated_at=at, address="127.0.0.1:9")


async def agent_works(url: str, worker: str) -> None:
    registry = RedisRegistry(url)
    try:
        await registry.generation()
        await registry.publish_worker(WorkerStatus(worker, 1, "local", "http://h:1", 2, 512),
                                      ttl_s=30)
        await registry.set_worker_layers(worker, {"sha256:" + "b" * 64: 10})
        await registry.set_worker_layers(worker, {"sha256:" + "c" * 64: 20})
        await registry.put_machine(machine("web", worker, time.time()))
        await registry.delete_machine("web", "m-web")
        await registry.put_machine(machine("web", worker, time.time()))
    finally:
        await registry.close()


async def placement_works(url: str) -> None:
    registry, book = RedisRegistry(url), RedisCoordination(url)
    try:
        generation = await registry.generation()
        await registry.put_app(AppConfig(name="web", image="hello:v1"))
        await registry.put_apps([AppConfig(name="web", image="hello:v1")])
        await registry.mark_republished(generation)
        assert [w.id for w in await registry.workers()] == ["w1"]
        assert await registry.layer_holders("sha256:" + "c" * 64) == {"w1": 20}
        assert [m.id for m in await registry.machines("web")] == ["m-web"]
        await registry.put_machine(machine("web", "w1", time.time() + 1))
        assert await registry.feed_position() != "0-0"
        token = await book.acquire("app:web", "p1", 5)
        assert isinstance(token, int)
        assert await book.renew([("app:web", token)], "p1", 5) == [True]
        await book.release("app:web", "p1", token)
        await released_heard(book, "wake:web", "p1")  # its release channel, heard
        await book.publish("web", "p1", book_claims(), 5)
        await book.others("web", "p2")
        assert await book.report("web", "e1", 2, 5) == 2
        await book.lapse("web", "e1", 2, 5)  # (HGET: only a wake's own value is lapsed)
        await book.suspect("w1", 1, "e1", "m-web", 5)
        await book.mark_failed("w1", 1, "unreachable", 5)
        assert [m.worker for m in await book.failed_workers()] == ["w1"]
        await registry.publish_placement(PlacementAdvert("p1", "http://p1:4280", "s"), 5)
        await registry.put_app(AppConfig(name="gone", image="hello:v1"))
        await registry.delete_app("gone")
    finally:
        await registry.close()
        await book.close()


def book_claims() -> Claims:
    return Claims(1, frozenset({"m-web"}))


async def edge_works(url: str) -> None:
    registry, board = RedisRegistry(url), RedisLoadBoard(url)
    try:
        generation = await registry.generation()
        assert await registry.republished() == generation
        assert [c.name for c in await registry.apps()] == ["web"]
        assert (await registry.app("web")) is not None
        assert set(await registry.machines_of(["web", "none"])) == {"web"}
        assert [m.id for m in await registry.machines("web")] == ["m-web"]
        assert [p.url for p in await registry.placements()] == ["http://p1:4280"]
        position = await registry.feed_position()
        changes = registry.changes(after="0-0")
        assert (await anext(changes)).seq <= position
        await changes.aclose()  # type: ignore[attr-defined]
        await board.share("e1", {}, {"web": 1}, ttl_s=5)
        assert await board.report("e1", "web", 2, 5.0) == 2  # its own thaw's demand check
    finally:
        await registry.close()
        await board.close()


async def test_each_role_does_all_its_work_with_its_own_user(locked: RedisServer) -> None:
    redis.Redis.from_url(locked.url).flushall()
    await agent_works(locked.url_of("agent-w1"), "w1")
    await placement_works(locked.url_of("placement"))
    await edge_works(locked.url_of("edge"))
    for user, role, worker in (("edge", "edge", ""), ("placement", "placement", ""),
                               ("agent", "agent", "w9"), ("agent-w1", "agent", "w1")):
        await check_access(locked.url_of(user), role, worker)


def refused(call: Callable[[], object]) -> str:
    with pytest.raises(ResponseError) as caught:
        call()
    return str(caught.value)


def test_an_agents_user_can_neither_reroute_an_app_nor_touch_another_worker(
    locked: RedisServer,
) -> None:
    admin = redis.Redis.from_url(locked.url)
    admin.hset("thaw:apps", "web", '{"name": "web"}')
    admin.set("thaw:worker:w2", '{"id": "w2"}')
    agent = redis.Redis.from_url(locked.url_of("agent-w1"))
    try:
        for call in (lambda: agent.hset("thaw:apps", "web", '{"name": "evil"}'),
                     lambda: agent.hdel("thaw:apps", "web"),
                     lambda: agent.set("thaw:worker:w2", '{"id": "w2", "url": "evil"}'),
                     lambda: agent.set("thaw:worker-epoch:w2", "999999"),
                     lambda: agent.hset("thaw:worker-layers:w2", "x", 1),
                     lambda: agent.hgetall("thaw:apps"),  # apps' env: not an agent's to read
                     # where edges send wakes (and held requests' answers come from)
                     lambda: agent.hset("thaw:placements", "p1", "1 {}"),
                     lambda: agent.keys("*"), lambda: agent.flushall(),
                     lambda: agent.config_get("*"), lambda: agent.script_flush(),
                     lambda: agent.acl_list()):
            with pytest.raises(NoPermissionError):
                call()
        # nor through a script: each redis.call is checked against the same ACL
        script = "return redis.call('HSET', KEYS[1], 'web', ARGV[1])"
        why = refused(lambda: agent.eval(script, 1, "thaw:apps", "{}"))
        assert "permission" in why.lower() or "access" in why.lower()
        why = refused(lambda: agent.evalsha(agent.script_load(
            "return redis.call('HSET', 'thaw:apps', 'web', '{}')"), 0))
        assert "access" in why.lower()
        assert admin.hget("thaw:apps", "web") == b'{"name": "web"}'
        assert admin.get("thaw:worker:w2") == b'{"id": "w2"}'
        # its own worker's record it does write
        assert agent.set("thaw:worker:w1", "{}")
    finally:
        agent.close()
        admin.close()


def test_the_edges_user_reads_routes_but_cannot_write_them(locked: RedisServer) -> None:
    edge = redis.Redis.from_url(locked.url_of("edge"))
    try:
        assert edge.hget("thaw:apps", "none") is None
        edge.get("thaw:worker:w1")  # allowed: one worker's heartbeat (its agent's URL)
        for call in (lambda: edge.hset("thaw:apps", "web", "{}"),
                     lambda: edge.hset("thaw:machines:web", "m", "{}"),
                     lambda: edge.xadd("thaw:changes", {"kind": "app", "key": "web"}),
                     lambda: edge.mget(["thaw:worker:w1"]),  # not every worker's at once
                     lambda: edge.smembers("thaw:workers"),
                     lambda: edge.set("thaw:worker:w1", "{}"),
                     lambda: edge.hset("thaw:placements", "p1", "1 {}"),
                     lambda: edge.hdel("thaw:placements", "p1")):
            with pytest.raises(NoPermissionError):
                call()
    finally:
        edge.close()


def run_service(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "thaw", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **ENV})


def service_args(role: str, tmp_path: Path) -> list[str]:
    port = str(free_port())
    if role == "edge":
        return ["edge", "--port", port, "--admin-port", "0"]
    return [role, "--port", port, "--state-dir", str(tmp_path / role)] + (
        ["--id", "w2"] if role == "agent" else [])


@pytest.mark.parametrize("role", ["edge", "placement", "agent"])
def test_a_wrong_password_stops_the_service_at_start_with_one_line(
    locked: RedisServer, tmp_path: Path, role: str,
) -> None:
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password\n")
    wrong.chmod(0o600)
    user = role if role != "agent" else "agent"
    done = run_service(*service_args(role, tmp_path), "--registry", locked.plain_url(user),
                       "--registry-password-file", str(wrong))
    assert done.returncode != 0
    [line] = done.stderr.strip().splitlines()
    assert line == (f"thaw {role}: redis at 127.0.0.1:{locked.port} refused user "
                    f"'{user}': invalid username-password pair or user is disabled.")
    assert "not-the-password" not in done.stdout + done.stderr


def test_a_worker_given_another_workers_user_is_refused_at_start(
    locked: RedisServer, tmp_path: Path,
) -> None:
    done = run_service(*service_args("agent", tmp_path), "--registry",
                       locked.plain_url("agent-w1"), "--registry-password-file",
                       str(locked.password_file("agent-w1")))  # runs as --id w2
    assert done.returncode != 0
    assert done.stderr.startswith(f"thaw agent: redis at 127.0.0.1:{locked.port} refused "
                                  "user 'agent-w1': NOPERM"), done.stderr
    assert "Traceback" not in done.stderr


def test_no_password_where_redis_asks_one_is_refused_saying_what_to_give(
    locked: RedisServer, tmp_path: Path,
) -> None:
    done = run_service(*service_args("edge", tmp_path), "--registry",
                       f"redis://127.0.0.1:{locked.port}/0")
    assert done.returncode != 0
    assert "--registry-password-file" in done.stderr and "Traceback" not in done.stderr


async def test_over_tls_each_role_works_and_an_untrusted_certificate_is_refused(
    locked_tls: RedisServer, tmp_path: Path,
) -> None:
    from ground.registry.access import with_credentials

    redis.Redis.from_url(locked_tls.url).flushall()
    url = with_credentials(f"rediss://agent-w1@127.0.0.1:{locked_tls.port}/0",
                           password_file=locked_tls.password_file("agent-w1"),
                           ca_file=Path(locked_tls.ca_file))
    await check_access(url, "agent", "w1")
    await agent_works(url, "w1")
    await placement_works(locked_tls.url_of("placement"))
    await edge_works(locked_tls.url_of("edge"))
    untrusted = locked_tls.url_of("edge").partition("?")[0]  # the system's CAs only
    with pytest.raises(RegistryRefused, match=r"TLS: .*certificate verify failed"):
        await check_access(untrusted, "edge")
