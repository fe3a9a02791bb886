"""A real redis-server on a free port, started and killed (by PID) by the tests.

`locked=True`: as production runs it — the default user needs a password
(requirepass) and a user per role (edge, placement, agent; and `agent-w1`... per
worker asked) with the ACL `thaw redis-acl` prints (ground/registry/acl.py), each with
its password in a 0600 file. `tls=True`: TLS only, with a certificate of a throwaway CA.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pytest
import redis.asyncio as redis

from ground.registry import acl
from tests.support.ports import free_port, wait_for_port

ADMIN = "admin"  # a user with every right, for the tests' own looks at the keys


@dataclass(frozen=True)
class RedisServer:
    port: int
    pid: int
    workdir: str = ""
    passwords: dict[str, str] = field(default_factory=dict)  # user -> password (locked)
    ca_file: str = ""  # tls: the CA its certificate chains to

    @property
    def scheme(self) -> str:
        return "rediss" if self.ca_file else "redis"

    @property
    def url(self) -> str:
        """Every right: the admin user's URL (locked), else no user at all."""
        return self.url_of(ADMIN) if self.passwords else self.plain_url()

    def plain_url(self, user: str = "") -> str:
        """Without a password (the user's, if named): for a password file."""
        query = f"?ssl_ca_certs={self.ca_file}" if self.ca_file else ""
        at = f"{user}@" if user else ""
        return f"{self.scheme}://{at}127.0.0.1:{self.port}/0{query}"

    def url_of(self, user: str) -> str:
        query = f"?ssl_ca_certs={self.ca_file}" if self.ca_file else ""
        secret = quote(self.passwords[user], safe="")
        return f"{self.scheme}://{user}:{secret}@127.0.0.1:{self.port}/0{query}"

    def password_file(self, user: str) -> Path:
        """A 0600 file with `user`'s password."""
        path = Path(self.workdir) / f"{user}.password"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(self.passwords[user] + "\n")
        return path

    async def flushed(self) -> str:
        """Its URL, every key deleted first (a session's server, fresh for one test)."""
        client = redis.Redis.from_url(self.url)
        await client.flushall()
        await client.aclose()
        return self.url


def _acl_file(path: Path, passwords: dict[str, str], workers: tuple[str, ...]) -> None:
    """Users: admin (all), edge, placement, agent (any worker) and agent-W per worker."""
    users = [("edge", "edge", ""), ("placement", "placement", ""), ("agent", "agent", ""),
             *((f"agent-{w}", "agent", w) for w in workers)]
    lines = [f"user default on #{acl.password_sha256(_password(passwords, 'default'))} "
             "~* &* +@all",
             f"user {ADMIN} on #{acl.password_sha256(_password(passwords, ADMIN))} ~* &* +@all"]
    for user, role, worker in users:
        lines.append(acl.acl_file_line(user, role, _password(passwords, user), worker))
    path.write_text("\n".join(lines) + "\n")


def _password(passwords: dict[str, str], user: str) -> str:
    return passwords.setdefault(user, secrets.token_urlsafe(18))


def _tls_flags(workdir: Path) -> tuple[list[str], str]:
    from thaw.localca import LocalCA

    ca = LocalCA(workdir / "ca")
    chain, key = ca.issue("localhost") or (b"", b"")
    (workdir / "server.pem").write_bytes(chain)
    (workdir / "server.key").write_bytes(key)
    os.chmod(workdir / "server.key", 0o600)
    flags = ["--tls-cert-file", str(workdir / "server.pem"),
             "--tls-key-file", str(workdir / "server.key"), "--tls-auth-clients", "no"]
    return flags, str(ca.cert_path)


@contextlib.contextmanager
def start_redis_server(port: int | None = None, *, locked: bool = False,
                       workers: tuple[str, ...] = (), tls: bool = False,
                       passwords: dict[str, str] | None = None) -> Iterator[RedisServer]:
    """`port`: where to listen (a free one unless given: a Redis restarted in place).
    `locked`: users and ACLs (see the module); `workers`: those that get their own
    agent user; `passwords`: the users' (kept when restarted in place)."""
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    workdir = tempfile.mkdtemp(prefix="thaw-redis-")
    port = port or free_port()
    known: dict[str, str] = {} if passwords is None else passwords
    flags: list[str] = ["--port", str(port)]
    ca_file = ""
    if tls:
        tls_flags, ca_file = _tls_flags(Path(workdir))
        flags = ["--port", "0", "--tls-port", str(port), *tls_flags]
    if locked:
        _acl_file(Path(workdir) / "users.acl", known, workers)
        flags += ["--aclfile", str(Path(workdir) / "users.acl")]
    proc = subprocess.Popen(
        [binary, *flags, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir, "--enable-debug-command", "local", "--logfile", ""],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port("127.0.0.1", port, timeout_s=10, alive=lambda: proc.poll() is None)
        yield RedisServer(port, proc.pid, workdir, known if locked else {}, ca_file)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with start_redis_server() as server:
        yield server


@pytest.fixture
def redis_own() -> Iterator[RedisServer]:
    """A Redis of the test's own, so that the test may kill, freeze or flush it."""
    with start_redis_server() as server:
        yield server
