"""`thaw placement --tls-cert/--tls-key` as an operator runs it: the API over HTTPS only,
the CLI verifying it (`--cacert`), the edge's signed calls verifying it too, /metrics
only on the admin listener, and the state files it writes private."""

from __future__ import annotations

import os
import ssl
import stat
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from edge.adapters.placement import PlacementClient
from edge.config import EdgeConfig
from edge.errors import EdgeError
from placement.api import WakeRequest
from tests.support.credentials import ADMIN_TOKEN, ENV, RING
from tests.support.ports import free_port, wait_for_port
from thaw.localca import LocalCA

pytestmark = pytest.mark.integration


@dataclass
class Served:
    api: str  # https://127.0.0.1:PORT
    admin: str  # http://127.0.0.1:PORT
    ca: Path  # the CA that signed the API's certificate
    state: Path
    proc: subprocess.Popen[bytes]


@pytest.fixture
def placement(tmp_path: Path) -> Iterator[Served]:
    ca = LocalCA(tmp_path / "ca")
    cert, key = ca.api_files()
    port, admin = free_port(), free_port()
    state = tmp_path / "state"
    with open(tmp_path / "placement.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "thaw", "placement", "--port", str(port), "--admin-port",
             str(admin), "--state-dir", str(state), "--tls-cert", str(cert), "--tls-key",
             str(key), "--log-level", "warning"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **ENV})
    try:
        wait_for_port("127.0.0.1", admin, timeout_s=20, alive=lambda: proc.poll() is None)
        yield Served(f"https://127.0.0.1:{port}", f"http://127.0.0.1:{admin}", ca.cert_path,
                     state, proc)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def thaw(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("THAW_CACERT", "THAW_TOKEN")}
    return subprocess.run([sys.executable, "-m", "thaw", *args], capture_output=True,
                          text=True, timeout=60, cwd=cwd, env=env, check=False)


def get(url: str, cafile: Path | None = None) -> tuple[int, str]:
    context = ssl.create_default_context(cafile=str(cafile)) if cafile else None
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_cli_with_the_cacert_reads_the_api_over_https(placement: Served,
                                                          tmp_path: Path) -> None:
    done = thaw("apps", "list", "--api", placement.api, "--token", ADMIN_TOKEN, "--cacert",
                str(placement.ca), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_cli_without_the_cacert_fails_with_a_certificate_error_and_no_traceback(
    placement: Served, tmp_path: Path,
) -> None:
    done = thaw("apps", "list", "--api", placement.api, "--token", ADMIN_TOKEN, cwd=tmp_path)
    assert done.returncode == 1
    assert "certificate not trusted" in done.stderr and "--cacert" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1


def test_the_cli_speaking_plain_http_to_the_tls_port_is_told_to_use_https(
    placement: Served, tmp_path: Path,
) -> None:
    plain = placement.api.replace("https://", "http://")
    done = thaw("apps", "list", "--api", plain, "--token", ADMIN_TOKEN, cwd=tmp_path)
    assert done.returncode == 1 and "https://" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_cacert_that_is_no_certificate_is_a_clear_error(placement: Served,
                                                          tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    for cacert in (str(junk), str(tmp_path / "missing.pem")):
        done = thaw("apps", "list", "--api", placement.api, "--cacert", cacert, cwd=tmp_path)
        assert done.returncode == 1 and f"--cacert {cacert}" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_metrics_are_404_on_the_public_port_and_served_on_the_admin_listener(
    placement: Served,
) -> None:
    status, _ = get(placement.api + "/metrics", placement.ca)
    assert status == 404  # with or without a token: the public port has no /metrics
    assert get(placement.api + "/healthz", placement.ca)[0] == 200
    status, text = get(placement.admin + "/metrics")
    assert status == 200 and "thaw_placement_apps 0.0" in text
    assert get(placement.admin + "/readyz")[0] == 200
    assert get(placement.admin + "/v1/apps")[0] == 404  # the admin listener is no API


def test_placement_refuses_to_start_with_a_key_that_does_not_match_the_certificate(
    tmp_path: Path,
) -> None:
    cert, _ = LocalCA(tmp_path / "a").api_files()
    _, other_key = LocalCA(tmp_path / "b").api_files()
    done = subprocess.run(
        [sys.executable, "-m", "thaw", "placement", "--port", "0", "--state-dir",
         str(tmp_path / "state"), "--tls-cert", str(cert), "--tls-key", str(other_key)],
        capture_output=True, text=True, timeout=60, env={**os.environ, **ENV}, check=False)
    assert done.returncode == 2, done.stderr
    assert f"TLS certificate {cert} with key {other_key}" in done.stderr
    assert "Traceback" not in done.stderr


async def test_the_edges_signed_calls_verify_placements_certificate(placement: Served
                                                                    ) -> None:
    trusted = PlacementClient(EdgeConfig(placement_url=placement.api, cluster_keys=RING,
                                         placement_cafile=str(placement.ca)))
    untrusting = PlacementClient(EdgeConfig(placement_url=placement.api, cluster_keys=RING))
    wake = WakeRequest(count=1, deadline_ms=1000)
    try:
        with pytest.raises(EdgeError) as answered:  # through TLS and the signature check
            await trusted.wake("nope", wake, timeout_s=5)
        assert answered.value.code == "not_found", answered.value
        with pytest.raises(EdgeError) as refused:
            await untrusting.wake("nope", wake, timeout_s=5)
        assert refused.value.code == "wake_failed" and "certificate" in str(refused.value)
    finally:
        await trusted.close()
        await untrusting.close()


def test_an_edge_given_a_cacert_that_is_missing_refuses_to_start(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    with pytest.raises(ValueError, match=f"--cacert {missing}"):
        PlacementClient(EdgeConfig(placement_url="https://127.0.0.1:9", cluster_keys=RING,
                                   placement_cafile=str(missing)))


def test_placements_state_dir_and_its_sqlite_files_are_private(placement: Served) -> None:
    status, _ = get(placement.api + "/v1/apps", placement.ca)  # (the store answered)
    assert status == 200
    files = {p.name: stat.S_IMODE(p.stat().st_mode) for p in placement.state.iterdir()}
    assert {"apps.sqlite3", "apps.sqlite3-wal", "apps.sqlite3-shm"} <= set(files)
    assert set(files.values()) == {0o600}, files
    assert stat.S_IMODE(placement.state.stat().st_mode) == 0o700
