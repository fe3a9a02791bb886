"""Placement's public API fuzzed from its own OpenAPI document (schemathesis).

A real `thaw placement` process, an app that the generated requests address, the
admin token: for a bounded number of cases per operation, no answer is a 5xx and
every answer matches the status codes, content types and schemas the document
(generated from the wire types) declares.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agent_process import call
from tests.support.credentials import ADMIN_TOKEN, ENV
from tests.support.ports import free_port, wait_for_port
from thaw.imagebuild import build_image

pytestmark = [pytest.mark.slow, pytest.mark.integration]

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"
# not_a_server_error would count the API's declared 503 no_capacity (no worker here) as a
# failure; no_internal_error (tests/support/st_hooks.py) refuses every 500 instead.
CHECKS = ("no_internal_error,status_code_conformance,content_type_conformance,"
          "response_schema_conformance")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def placement(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    with open(tmp_path / "placement.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "thaw", "placement", "--port", str(port), "--state-dir",
             str(tmp_path / "state"), "--allow-layout", str(tmp_path),
             "--only-allowed-registries",  # loopback only: no generated name reaches DNS
             "--log-level", "error"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **ENV})
    try:
        wait_for_port("127.0.0.1", port, timeout_s=20, alive=lambda: proc.poll() is None)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_the_public_api_fuzzed_from_its_openapi_document_never_fails_or_breaks_its_schema(
    placement: str, tmp_path: Path
) -> None:
    build_image(HELLO, "hello:v1", layout=tmp_path / "layout")
    status, body = call("POST", f"{placement}/v1/apps", token=ADMIN_TOKEN,
                        body={"name": "fuzzed", "image": f"oci:{tmp_path / 'layout'}:v1"})
    assert status == 201, body
    config = tmp_path / "schemathesis.toml"
    config.write_text('[parameters]\napp = "fuzzed"\n')
    st = shutil.which("st", path=str(Path(sys.executable).parent))
    assert st is not None, "schemathesis is part of the test extra"
    run = subprocess.run(
        [st, "--config-file", str(config), "run", f"{placement}/openapi.json",
         "-H", f"Authorization: Bearer {ADMIN_TOKEN}", "--checks", CHECKS,
         "--max-examples", "15", "--seed", "7", "--no-shrink", "--request-timeout", "10",
         "--generation-database", "none", "--report-dir", str(tmp_path / "report")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False,
        env={**os.environ, "SCHEMATHESIS_HOOKS": "tests.support.st_hooks",
             "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, run.stdout[:6000] + run.stderr[-2000:]
    counts = re.search(r"(\d+) generated, (\d+) passed", run.stdout)
    assert counts is not None and counts.group(1) == counts.group(2), run.stdout[-3000:]
    assert int(counts.group(1)) > 500  # every operation was exercised, not skipped
