"""Every module a warm request runs code of is in the compiled set (ground/native.py
SOURCES): a module left out runs interpreted on every request, and nothing else would
say so. The modules are found by running warm HTTP/1.1 and h2c requests through an
in-process edge with a profile hook (tests/support/warm_modules.py), pure Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ground.native import ROOT, SOURCES
from tests.support.warm_modules import GENERATED, TRACED

pytestmark = pytest.mark.integration

# On the warm path but not compiled, each for a reason (none today)
INTERPRETED: dict[str, str] = {}


def test_every_module_a_warm_request_runs_is_compiled() -> None:
    found = subprocess.run(
        [sys.executable, "-m", "tests.support.warm_modules"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, "THAW_NATIVE": "0"})
    assert found.returncode == 0, found.stderr[-3000:]
    modules = json.loads(found.stdout.strip().splitlines()[-1])
    assert "edge/adapters/http1.py" in modules["http1"]  # the hook saw the warm path
    assert "edge/adapters/http2.py" in modules["h2c"]
    for protocol in ("http1", "h2c"):
        # code generated at run time (a dataclass made per request) runs interpreted
        # however compiled its module is: the head types were, 7k instructions a request
        assert GENERATED not in modules[protocol], (
            f"{protocol}: generated code (a dataclass's methods?) runs on every warm "
            f"request: {modules[protocol + ' calls']}")
        missing = sorted(set(modules[protocol]) - set(SOURCES) - set(INTERPRETED) -
                         {GENERATED})
        assert not missing, (f"{protocol}: warm requests run these interpreted: {missing}; "
                             f"calls per module in {TRACED} requests: "
                             f"{modules[protocol + ' calls']}")
