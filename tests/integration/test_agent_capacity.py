"""A worker's disk follows what runs: under pressure the images of stopped machines go
first, and such a machine still starts (its image pulled again)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.agent_process import AgentProcess, call
from thaw.imagebuild import BuildOverrides, build_image

pytestmark = pytest.mark.integration
GUEST = {"cpus": 0.25, "memory_mb": 32}


def heavy_image(root: Path, name: str) -> str:
    """The busybox base (its static tinyhttp serves) plus 300 KiB that do not compress:
    ~5 MB in the cache with its unpacked copy, and ~3.7 MB more for a second such image
    (the base's blob is shared): one fits a 6 MiB cache, two do not."""
    src = root / f"{name}-src"
    src.mkdir()
    (src / "ballast.bin").write_bytes(os.urandom(300 * 1024))
    build_image(src, f"{name}:v1", layout=root / name, overrides=BuildOverrides(
        base="builtin:busybox", entrypoint=["tinyhttp"]))
    return f"oci:{root / name}:v1"


def test_under_disk_pressure_a_stopped_machines_image_goes_and_it_still_starts(
    tmp_path: Path,
) -> None:
    first, second = heavy_image(tmp_path, "first"), heavy_image(tmp_path, "second")
    agent = AgentProcess(tmp_path / "agent", extra=["--cache-budget-mb", "6"]).start()
    try:
        status, machine = call("POST", f"{agent.url}/v1/offers", {
            "key": "k1", "app": "a", "image": first, "guest": GUEST, "start": True})
        assert status == 201, machine
        agent.wait_state(machine["id"], "started")
        assert call("POST", f"{agent.url}/v1/machines/{machine['id']}/stop")[0] == 200
        agent.wait_state(machine["id"], "stopped")
        # the stopped machine's image is let go so that another one fits
        status, pulled = call("POST", f"{agent.url}/v1/images/pull", {"ref": second})
        assert status == 200, pulled
        assert call("POST", f"{agent.url}/v1/machines/{machine['id']}/start")[0] == 200
        assert agent.wait_state(machine["id"], "started")["state"] == "started"
        # a running machine's image is never let go: now nothing more fits
        status, refused = call("POST", f"{agent.url}/v1/images/pull", {"ref": second})
        assert (status, refused["error"]) == (507, "no_space"), refused
    finally:
        agent.cleanup()
