"""Placement's PostgreSQL asks for a password (SCRAM): given from a file it serves; a wrong
one, or none, stops placement at start with one line that does not show it."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from placement.store import open_store
from placement.store.postgres import StoreRefused
from tests.support.credentials import ENV
from tests.support.ports import free_port, wait_for_port
from tests.support.postgres import PostgresServer, postgres_server, postgres_url

pytestmark = pytest.mark.integration

__all__ = ["postgres_server", "postgres_url"]  # fixtures


def first_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The first line `proc` writes to its stdout, within `timeout_s` ("" if none)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    return proc.stdout.readline() if ready else ""


def placement(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "thaw", "placement", "--state-dir", str(tmp_path / "p"),
         *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **ENV})


async def test_a_url_without_the_password_or_with_a_wrong_one_is_refused_by_the_server(
    postgres_server: PostgresServer, tmp_path: Path,
) -> None:
    bare = postgres_server.url(password=False)
    for url in (bare, bare.replace("thaw@", "thaw:wrong@")):
        with pytest.raises(StoreRefused, match=(
                f"postgresql at 127.0.0.1:{postgres_server.port} refused user 'thaw': "
                "password authentication failed")):
            await open_store(url, tmp_path)
    store = await open_store(postgres_server.url(), tmp_path)
    await store.close()


def test_placement_with_a_wrong_password_says_so_at_start_and_exits_non_zero(
    postgres_server: PostgresServer, tmp_path: Path,
) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("hunter2\n")
    wrong.chmod(0o600)
    proc = placement(tmp_path, "--port", str(free_port()), "--store",
                     postgres_server.url(password=False), "--store-password-file", str(wrong))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    [line] = err.strip().splitlines()
    assert line.startswith("thaw placement: postgresql at 127.0.0.1:"), err
    assert "refused user 'thaw': password authentication failed" in line
    assert "hunter2" not in out + err


def test_placement_serves_on_postgres_with_its_password_from_a_file(
    postgres_server: PostgresServer, tmp_path: Path,
) -> None:
    url = postgres_server.create_database("credentials").replace(
        f":{postgres_server.password}@", "@")
    port = free_port()
    proc = placement(tmp_path, "--port", str(port), "--store", url,
                     "--store-password-file", postgres_server.password_file)
    try:
        wait_for_port("127.0.0.1", port, timeout_s=30, alive=lambda: proc.poll() is None)
        # its port is bound a moment before it says so: read until it has
        first = first_line(proc, timeout_s=30)
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert first.startswith("thaw placement listening on"), (first, err)
    assert postgres_server.password not in first + out + err
