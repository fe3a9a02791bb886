"""`thaw up` started as a user would, driven over HTTP only."""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import hashlib
import http.client
import json
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.agent_process import call, wait_until
from tests.support.machines import oci_driver_runs
from tests.support.platform import ThawUp
from thaw.imagebuild import BuildOverrides, build_image

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ECHO = Path(__file__).parent / "apps" / "echo"
HOST = "hello.localhost"


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    layout = tmp_path_factory.mktemp("layout")
    build_image(ECHO, "echo:echo", layout=layout,
                overrides=BuildOverrides(entrypoint=["python3", "app.py"]))
    build_image(ECHO, "echo:stuck", layout=layout,
                overrides=BuildOverrides(entrypoint=["python3", "app.py", "--never-listen"]))
    build_image(ECHO, "echo:slowboot", layout=layout, overrides=BuildOverrides(
        entrypoint=["python3", "app.py", "--boot-delay", "1"]))
    return {"echo": f"oci:{layout}:echo", "stuck": f"oci:{layout}:stuck",
            "slowboot": f"oci:{layout}:slowboot"}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThawUp]:
    platform = ThawUp(tmp_path_factory.mktemp("thaw"), hello=["idle_timeout_s=2"]).start()
    try:
        yield platform
    finally:
        platform.cleanup()


def create_app(up: ThawUp, name: str, image: str, **fields: Any) -> None:
    status, body = call("POST", f"{up.api}/v1/apps", {"name": name, "image": image, **fields},
                        token=up.token)
    assert status == 201, body


def edge_get(
    up: ThawUp, host: str, path: str = "/", timeout_s: float = 30
) -> tuple[int, Any, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", up.edge_port, timeout=timeout_s)
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        return response.status, response.read().decode(), dict(response.getheaders())
    finally:
        conn.close()


def machines(up: ThawUp, app: str) -> list[dict[str, Any]]:
    status, body = call("GET", f"{up.api}/v1/apps/{app}/machines", token=up.token)
    assert status == 200, body
    return [m for m in body if m["state"] != "destroyed"]


def held(up: ThawUp, app: str) -> int:
    _, state = call("GET", f"{up.admin}/v1/state")
    return int(state["apps"].get(app, {}).get("held", 0))


def test_a_cold_app_answers_reuses_its_machine_stops_when_idle_and_wakes_the_same_one(
    up: ThawUp,
) -> None:
    status, body, headers = edge_get(up, HOST)
    assert status == 200 and body.startswith("hello from "), body
    first = body.split()[-1]
    timing = headers.get("Server-Timing", "")
    assert "hold;dur=" in timing and "place;dur=" in timing and "boot;dur=" in timing

    status, body, headers = edge_get(up, HOST)
    assert status == 200 and body.split()[-1] == first
    assert "Server-Timing" not in headers  # warm: no wake

    wait_until(lambda: [m["state"] for m in machines(up, "hello")] == ["stopped"], 20, 0.2)

    status, body, headers = edge_get(up, HOST)
    assert status == 200 and body.split()[-1] == first  # the same machine, woken again
    assert "hold;dur=" in headers.get("Server-Timing", "")
    assert [m["id"] for m in machines(up, "hello")] == [first]


def test_a_burst_of_200_starts_exactly_ceil_200_over_soft_limit_machines(
    up: ThawUp, images: dict[str, str]
) -> None:
    # The app boots in 1 s, so the whole burst is held when the first wake returns: the
    # second wake is sized from all 200 (with a 60 ms boot it may race the arrivals).
    create_app(up, "burst", images["slowboot"], max_machines=10, idle_timeout_s=60,
               concurrency={"type": "requests", "soft_limit": 50, "hard_limit": 60})

    async def burst() -> list[int]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            async def one() -> int:
                async with session.get(f"{up.edge}/slow?s=0.3",
                                       headers={"Host": "burst.localhost"}) as response:
                    await response.read()
                    return response.status

            return await asyncio.gather(*(one() for _ in range(200)))

    statuses = asyncio.run(burst())
    assert statuses == [200] * 200
    assert len(machines(up, "burst")) == 4  # min(max_machines=10, ceil(200 / 50))


def test_an_app_that_never_becomes_ready_answers_every_held_request_before_its_deadline(
    up: ThawUp, images: dict[str, str]
) -> None:
    create_app(up, "stuck", images["stuck"], hold_timeout_s=2, health={"timeout_s": 1.5})

    async def many() -> list[tuple[int, float, str]]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            async def one() -> tuple[int, float, str]:
                began = time.monotonic()
                async with session.get(f"{up.edge}/",
                                       headers={"Host": "stuck.localhost"}) as response:
                    body = await response.text()
                    return response.status, time.monotonic() - began, body

            return await asyncio.gather(*(one() for _ in range(20)))

    results = asyncio.run(many())
    assert {status for status, _, _ in results} <= {503, 504}
    assert max(elapsed for _, elapsed, _ in results) < 2 + 1
    assert all(json.loads(body)["error"] for _, _, body in results)
    wait_until(lambda: held(up, "stuck") == 0, 5)


def test_a_full_hold_queue_answers_503_with_retry_after_at_once(
    up: ThawUp, images: dict[str, str]
) -> None:
    create_app(up, "tiny", images["stuck"], max_pending=2, hold_timeout_s=4,
               health={"timeout_s": 3.5})

    async def scenario() -> tuple[int, dict[str, str], float]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            hdrs = {"Host": "tiny.localhost"}
            waiting = [asyncio.ensure_future(session.get(f"{up.edge}/", headers=hdrs))
                       for _ in range(2)]
            await asyncio.to_thread(wait_until, lambda: held(up, "tiny") == 2, 10)
            began = time.monotonic()
            async with session.get(f"{up.edge}/", headers=hdrs) as response:
                await response.read()
                result = (response.status, dict(response.headers), time.monotonic() - began)
            for pending in await asyncio.gather(*waiting):
                pending.release()
            return result

    status, headers, elapsed = asyncio.run(scenario())
    assert status == 503 and "Retry-After" in headers
    assert elapsed < 1.0  # at once, not after the hold timeout


def test_an_unknown_host_is_404_json(up: ThawUp) -> None:
    status, body, _ = edge_get(up, "nope.localhost")
    assert status == 404 and json.loads(body)["error"]


def test_an_invalid_app_config_is_422_naming_the_field(up: ThawUp) -> None:
    status, body = call("POST", f"{up.api}/v1/apps",
                        {"name": "bad", "image": "x", "concurrency": {"soft_limit": "lots"}},
                        token=up.token)
    assert status == 422 and body["field"] == "concurrency.soft_limit"


def test_an_app_cannot_take_another_apps_host_name_and_the_owner_keeps_its_traffic(
    up: ThawUp, images: dict[str, str]
) -> None:
    def reserved_cpus() -> float:
        return round(sum(w["reserved_cpus"] for w in
                         call("GET", f"{up.api}/v1/workers", token=up.token)[1]), 3)

    before = reserved_cpus()
    small = {"cpus": 0.1, "memory_mb": 64}  # this module's platform is shared: leave room
    create_app(up, "owner", images["echo"], hosts=["www.owner.test"], guest=small)
    for claim, status in [("www.owner.test", 409), ("WWW.Owner.TEST.", 409),
                          ("hello.localhost", 422), ("owner.localhost", 422)]:
        got, body = call("POST", f"{up.api}/v1/apps",
                         {"name": "thief", "image": images["echo"], "hosts": [claim]},
                         token=up.token)
        assert got == status, (claim, body)
    create_app(up, "thief", images["echo"], guest=small)
    got, _ = call("PATCH", f"{up.api}/v1/apps/thief", {"hosts": ["www.owner.test"]},
                  token=up.token)
    assert got == 409
    status, body, _ = edge_get(up, "www.owner.test")
    assert status == 200 and body.startswith("echo ")
    assert body.split()[-1] in [m["id"] for m in machines(up, "owner")]
    assert machines(up, "thief") == []  # nothing of the thief's was started for it
    status, body, _ = edge_get(up, "hello.localhost")
    assert status == 200 and body.startswith("hello from ")
    for app in ("owner", "thief"):  # give the shared platform its capacity back
        assert call("DELETE", f"{up.api}/v1/apps/{app}", token=up.token)[0] == 200
    wait_until(lambda: reserved_cpus() <= before, 20, 0.1)  # others may have ended meanwhile


@pytest.mark.skipif(not oci_driver_runs(), reason="a machine's own port needs its own network "
                    "namespace: the OCI driver (root and runc)")
def test_an_app_listening_on_its_configured_port_9000_is_served_through_the_edge(
    up: ThawUp,
) -> None:
    probe = Path(__file__).resolve().parent / "apps" / "probe"
    layout = up.state_dir.parent / "probe-layout"
    build_image(probe, "probe:v1", layout=layout)
    create_app(up, "nine", f"oci:{layout}:probe:v1", port=9000, env={"PROBE_PORT": "9000"},
               guest={"cpus": 0.1, "memory_mb": 64})
    status, body, _ = edge_get(up, "nine.localhost", "/status")
    assert status == 200, body
    assert json.loads(body)["pid"] == "1"  # the probe, as its container's init
    assert [m["address"].endswith(":9000") for m in machines(up, "nine")] == [True]
    assert call("DELETE", f"{up.api}/v1/apps/nine", token=up.token)[0] == 200


# What keeps modes of its own under a state dir, and why (docs/security.md, "State files"):
# image content (modes from the image, which machines need), a machine's own writes
# (its users' modes), and what runc writes (its state dir, 0711; its pid file and log).
NOT_PRIVATE_DIRS = ("images", "agent-*/images/blobs", "agent-*/images/rootfs",
                    "agent-*/machines/*/upper", "agent-*/machines/*/work", "agent-*/runtime/*")
NOT_PRIVATE_FILES = ("agent-*/machines/*/bundle/runtime.log",
                     "agent-*/machines/*/bundle/init.pid")


def state_modes(state_dir: Path) -> dict[str, int]:
    """Relative path -> permission bits of every dir and file under `state_dir` (itself
    ".") but those of NOT_PRIVATE_*; what vanishes meanwhile is skipped."""
    modes: dict[str, int] = {}
    for root, dirs, files in os.walk(state_dir):
        here = Path(root).relative_to(state_dir).as_posix()
        dirs[:] = [d for d in dirs if not any(
            fnmatch.fnmatch(f"{here}/{d}".removeprefix("./"), p) for p in NOT_PRIVATE_DIRS)]
        for name in [".", *files]:
            relative = f"{here}/{name}".removeprefix("./").removesuffix("/.") or "."
            if any(fnmatch.fnmatch(relative, p) for p in NOT_PRIVATE_FILES):
                continue
            try:
                modes[relative] = stat.S_IMODE(os.lstat(state_dir / relative).st_mode)
            except FileNotFoundError:
                continue
    return modes


def test_after_an_app_with_a_secret_in_its_env_ran_every_state_file_is_0600_in_0700_dirs(
    up: ThawUp,
) -> None:
    _, hello = call("GET", f"{up.api}/v1/apps/hello", token=up.token)
    secret = "s3cret-" + os.urandom(8).hex()
    create_app(up, "secretive", hello["image"], env={"API_KEY": secret}, idle_timeout_s=60,
               guest={"cpus": 0.1, "memory_mb": 64})  # the module's platform is shared
    status, body, _ = edge_get(up, "secretive.localhost")
    assert status == 200, body
    modes = state_modes(up.state_dir)
    holders = set()
    for relative, mode in modes.items():
        path = up.state_dir / relative
        if path.is_dir():
            assert mode == 0o700, (relative, oct(mode))
        else:
            assert mode == 0o600, (relative, oct(mode))
            with contextlib.suppress(OSError):
                if path.is_file() and secret.encode() in path.read_bytes():
                    holders.add(path.name)
    # the files the secret is in were among those walked
    assert "oplog" in holders and holders & {"apps.sqlite3", "apps.sqlite3-wal"}, holders
    if oci_driver_runs():
        assert "config.json" in holders, holders
    assert call("DELETE", f"{up.api}/v1/apps/secretive", token=up.token)[0] == 200


def test_the_cli_finds_the_local_admin_token_and_the_edge_needs_none(tmp_path: Path) -> None:
    """The quick start: `thaw up` in a directory, then the CLI there with no token given."""
    up = ThawUp(tmp_path / ".thaw", agents=1).start()
    try:
        token_file = tmp_path / ".thaw" / "admin.token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        assert (tmp_path / ".thaw" / "cluster.key").stat().st_mode & 0o777 == 0o600
        assert (tmp_path / ".thaw" / "secrets.key").stat().st_mode & 0o777 == 0o600
        assert (tmp_path / ".thaw" / "route.key").stat().st_mode & 0o777 == 0o600
        assert "admin.token" in up.output.decode()
        env = {k: v for k, v in os.environ.items() if k != "THAW_TOKEN"}
        status = subprocess.run([sys.executable, "-m", "thaw", "status", "--api", up.api],
                                capture_output=True, text=True, timeout=60, cwd=tmp_path,
                                env=env, check=False)
        assert status.returncode == 0 and "hello" in status.stdout, status.stderr
        listed = subprocess.run([sys.executable, "-m", "thaw", "secrets", "set", "hello",
                                 "API_TOKEN=-", "--api", up.api],
                                input="hi\n", capture_output=True, text=True, timeout=60,
                                cwd=tmp_path, env=env, check=False)
        assert listed.returncode == 0 and "release 2" in listed.stdout, listed.stderr
        elsewhere = subprocess.run([sys.executable, "-m", "thaw", "apps", "list", "--api",
                                    up.api], capture_output=True, text=True, timeout=60,
                                   cwd=tmp_path / ".thaw", env=env, check=False)
        assert elsewhere.returncode == 1 and "HTTP 401" in elsewhere.stderr
        code, body, _ = edge_get(up, HOST)  # app traffic needs no token
        assert code == 200 and body.startswith("hello from ")
    finally:
        up.cleanup()


def test_content_length_with_transfer_encoding_is_400_and_the_connection_closes(
    up: ThawUp,
) -> None:
    with socket.create_connection(("127.0.0.1", up.edge_port), timeout=5) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: hello.localhost\r\nContent-Length: 5\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 400")


def test_a_10_mib_body_and_a_10_mib_streamed_response_pass_through_intact(
    up: ThawUp, images: dict[str, str]
) -> None:
    create_app(up, "echo", images["echo"])
    body = os.urandom(10 << 20)

    async def scenario() -> tuple[str, bytes]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            hdrs = {"Host": "echo.localhost"}
            async with session.post(f"{up.edge}/", data=body, headers=hdrs) as response:
                echoed = await response.text()
            async with session.get(f"{up.edge}/stream?bytes={10 << 20}",
                                   headers=hdrs) as response:
                assert response.headers.get("Transfer-Encoding") == "chunked"
                streamed = await response.read()
            return echoed, streamed

    echoed, streamed = asyncio.run(scenario())
    assert echoed == hashlib.sha256(body).hexdigest()
    expected = (bytes(range(256)) * 256 * 160)[: 10 << 20]
    assert hashlib.sha256(streamed).digest() == hashlib.sha256(expected).digest()


def test_thaw_up_stops_on_sigterm_and_leaves_no_machine_process(tmp_path: Path) -> None:
    platform = ThawUp(tmp_path / "thaw", agents=1).start()
    try:
        status, body, _ = edge_get(platform, HOST)
        assert status == 200 and body.startswith("hello from")
        assert platform.machine_pids()
        assert platform.stop() == 0
        assert platform.machine_pids() == []
    finally:
        platform.cleanup()
