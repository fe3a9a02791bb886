"""The edge package loads compiled modules exactly when ground.native says it may."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = ("import edge.adapters.http1, edge.core.framing, ground.native as n; "
         "print(n.state()[0], edge.adapters.http1.__file__.endswith('.so'), "
         "edge.core.framing.__file__.endswith('.so'))")


@pytest.mark.parametrize("disable", [None, "0"])
def test_the_modules_loaded_are_the_ones_the_state_names(disable: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "THAW_NATIVE"}
    if disable is not None:
        env["THAW_NATIVE"] = disable
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    on, client_compiled, framing_compiled = (word == "True" for word in out)
    assert client_compiled == on and framing_compiled == on
    if disable == "0":
        assert not on
