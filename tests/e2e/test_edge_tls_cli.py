"""`thaw edge --tls-cert --tls-key --tls-port`, started as an operator would: it answers
HTTPS with the certificate given, h2 and HTTP/1.1 by ALPN, and says its TLS port."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.ports import free_port
from thaw.localca import LocalCA

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")]


def test_thaw_edge_serves_https_with_the_certificate_it_is_given(tmp_path: Path) -> None:
    ca = LocalCA(tmp_path / "ca", domain="localhost")
    chain, key = ca.issue("edge.localhost") or (b"", b"")
    (tmp_path / "cert.pem").write_bytes(chain)
    (tmp_path / "key.pem").write_bytes(key)
    key_file = tmp_path / "cluster.key"
    key_file.touch(mode=0o600)
    key_file.write_bytes(b"tls-cli-test-key-" + b"k" * 32)
    route_key = tmp_path / "route.key"  # as an operator runs it: records verified
    route_key.touch(mode=0o600)
    route_key.write_bytes(b"tls-cli-route-key-" + b"r" * 32)
    for _ in range(3):  # a free port may be taken by another process before the bind
        port, tls_port = free_port(), free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "thaw", "edge", "--port", str(port), "--tls-port",
             str(tls_port), "--tls-cert", str(tmp_path / "cert.pem"), "--tls-key",
             str(tmp_path / "key.pem"), "--cluster-key-file", str(key_file),
             "--route-key-file", str(route_key), "--placement",
             "http://127.0.0.1:9", "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=os.environ.copy())
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if "address already in use" not in line:
            break
        proc.wait(timeout=10)
    try:
        assert f"TLS :{tls_port}" in line, line
        for flag, version in (("--http2", "2"), ("--http1.1", "1.1")):
            out = subprocess.run(
                ["curl", "-sS", flag, "--max-time", "10", "-w", "\n%{http_version} %{http_code}",
                 "--cacert", str(ca.cert_path), "--resolve",
                 f"edge.localhost:{tls_port}:127.0.0.1", f"https://edge.localhost:{tls_port}/"],
                capture_output=True, text=True, timeout=30)
            assert out.returncode == 0, out.stderr
            body, _, summary = out.stdout.rpartition("\n")
            assert summary == f"{version} 404" and '"unknown_app"' in body  # no app: 404 JSON
    finally:
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
