"""A real PostgreSQL server for the tests: initdb into a temp dir, `postgres` on a free
port, a password (SCRAM, scram-sha-256) asked on every connection as in production
(`url()` carries it; `password_file` holds it), one database; killed and restarted (by
PID) on the same data dir.

initdb and postgres refuse to run as root: as root, both run as `nobody` (the data
dir chowned to it). Reusable: `PostgresServer` (start/kill/restart/stop, `url`) for
tests of several placements on one database; `postgres_server` is session-scoped,
`postgres_url` a fresh database per test on it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

from tests.support.ports import free_port, wait_for_port

USER = "thaw"
UNPRIVILEGED = "nobody"


def postgres_binary(name: str) -> str:
    """`initdb`/`postgres`/`psql`: on PATH, else Debian's /usr/lib/postgresql/N/bin."""
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise RuntimeError(f"{name} is not installed (Debian package postgresql: make sysdeps)")
    return found


class PostgresServer:
    def __init__(self, listen: str = "127.0.0.1") -> None:
        """`listen`: the addresses it listens on (listen_addresses; "*" for every one)."""
        self.listen = listen
        self.dir = tempfile.mkdtemp(prefix="thaw-postgres-")
        self.data = os.path.join(self.dir, "data")
        self.sockets = os.path.join(self.dir, "sockets")
        self.port = free_port()
        self.password = secrets.token_urlsafe(18)
        self.password_file = os.path.join(self.dir, "password")  # 0600, for --store-password-file
        self._proc: subprocess.Popen[bytes] | None = None
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            entry = pwd.getpwnam(UNPRIVILEGED)
            # setpriv execs (runuser would stay as the parent, and take the kill -9)
            self._as_user = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}",
                             "--clear-groups", "--"]
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self.password + "\n")
        if self._as_user:
            os.chown(self.password_file, pwd.getpwnam(UNPRIVILEGED).pw_uid, -1)
        self._run(postgres_binary("initdb"), "-D", self.data, "-U", USER,
                  "--auth=scram-sha-256", f"--pwfile={self.password_file}",
                  "-E", "UTF8", "--no-sync")
        if self._as_user:  # the tests (root) read it too
            os.chown(self.password_file, 0, -1)
        os.makedirs(self.sockets, exist_ok=True)
        if self._as_user:
            os.chown(self.sockets, pwd.getpwnam(UNPRIVILEGED).pw_uid, -1)

    def url(self, database: str = "postgres", *, password: bool = True) -> str:
        """With the password in it, unless `password=False` (then give the file)."""
        secret = f":{self.password}" if password else ""
        return f"postgresql://{USER}{secret}@127.0.0.1:{self.port}/{database}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self, timeout_s: float = 30.0) -> None:
        """Start, retried while the killed server's backends still hold its shared
        memory (they exit when they notice the postmaster is gone)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._start_once()
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _start_once(self) -> None:
        self._proc = subprocess.Popen(
            [*self._as_user, postgres_binary("postgres"), "-D", self.data, "-p",
             str(self.port), "-k", self.sockets, "-c", f"listen_addresses={self.listen}",
             "-c", "fsync=off", "-c", "max_connections=200"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        proc = self._proc
        wait_for_port("127.0.0.1", self.port, timeout_s=30, alive=lambda: proc.poll() is None)
        self._wait_ready()

    def kill(self) -> None:
        """kill -9 the server (its backends exit when they notice)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=10)
            self._proc = None

    def pause(self) -> None:
        """SIGSTOP the server and every backend (its own process group): a database that
        stalls, neither refusing nor answering. `resume` undoes it (call it before `stop`:
        frozen backends would not notice a killed server)."""
        if self._proc is not None:
            os.killpg(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None:
            os.killpg(self._proc.pid, signal.SIGCONT)

    def restart(self) -> None:
        """After `kill`: start again on the same data dir and port (crash recovery)."""
        self.kill()
        self.start()

    def create_database(self, name: str) -> str:
        self._psql(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            done = subprocess.run(
                [postgres_binary("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER,
                 "-d", "postgres", "-Atc", "SELECT 1"], capture_output=True, check=False,
                env=self._psql_env())
            if done.returncode == 0 or time.monotonic() > deadline:
                return
            time.sleep(0.05)

    def _psql(self, sql: str) -> None:
        subprocess.run([postgres_binary("psql"), "-h", "127.0.0.1", "-p", str(self.port),
                        "-U", USER, "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-qc", sql],
                       check=True, capture_output=True, env=self._psql_env())

    def _psql_env(self) -> dict[str, str]:
        return {**os.environ, "PGPASSWORD": self.password}

    def _run(self, *argv: str) -> None:
        subprocess.run([*self._as_user, *argv], check=True, capture_output=True)


@contextlib.contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    with running_postgres() as server:
        yield server


_databases = iter(range(1, 1 << 30))


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A fresh, empty database on the session's server."""
    return postgres_server.create_database(f"t{next(_databases)}")
