"""Where a machine's full create goes under the OCI driver: each step of `launch` timed
(the rootfs and files, the runtime's create, the network, the runtime's start), for a
machine with no container, rootfs or network yet.

    .venv/bin/python loadtests/profile_oci_create.py [--machines 20]

Needs root and runc. Prints p50 per step (ms); docs/benchmarks.md quotes it.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent import ocidriver
from agent.driverport import LaunchSpec
from agent.outputs import Outputs
from loadtests.benchlib import machine_line, median, percentile
from tests.support.machines import app_rootfs

Steps = dict[str, list[float]]


def timed_async(steps: Steps, name: str, call: Callable[..., Awaitable[Any]]
                ) -> Callable[..., Awaitable[Any]]:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return await call(*args, **kwargs)
        finally:
            steps.setdefault(name, []).append((time.perf_counter() - began) * 1000)
    return wrapper


def timed(steps: Steps, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            steps.setdefault(name, []).append((time.perf_counter() - began) * 1000)
    return wrapper


def tiny_machine(state: Path, outputs: Outputs, mid: str, rootfs: Path) -> LaunchSpec:
    """A machine of the static tinyhttp image, its directory and output made."""
    directory = state / "machines" / mid
    directory.mkdir(mode=0o700)
    outputs.ensure(mid, directory)
    return LaunchSpec(mid, "bench", ["tinyhttp"], {"PATH": "/usr/local/bin:/bin",
                                                  "PORT": "8080"}, rootfs, "/", "", 8080,
                      0.5, 64, directory)


async def profile(rootfs: Path, work: Path, machines: int) -> Steps:
    state = work / "state"
    (state / "machines").mkdir(parents=True, mode=0o700)
    driver = ocidriver.OciDriver(state)
    steps: Steps = {}
    driver.files.materialise = timed(steps, "rootfs, claims, config (thread)",  # type: ignore[method-assign]
                                     driver.files.materialise)
    for name in ("create", "start"):
        setattr(driver.runtime, name,
                timed_async(steps, f"runtime {name}", getattr(driver.runtime, name)))
    driver._link_up = timed_async(steps, "network (2 ip batches, nft beside)",  # type: ignore[method-assign]
                                  driver._link_up)
    outputs = Outputs()
    try:
        for n in range(machines):
            spec = tiny_machine(state, outputs, f"prof{n:010d}", rootfs)
            run = await timed_async(steps, "launch, in all", driver.launch)(spec)
            await driver.stop(run, signal.SIGKILL, 1)
            await driver.destroy(spec.machine_id, spec.machine_dir)
    finally:
        await driver.sweep(state / "machines")
        outputs.close_all()
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--machines", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="thaw-profile-create-"))
    try:
        rootfs = app_rootfs(work, "tiny", {"README": "tinyhttp\n"}, base="builtin:busybox",
                            workdir="/")
        steps = asyncio.run(profile(rootfs, work, args.machines))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"Command: `python loadtests/profile_oci_create.py --machines {args.machines}`  ")
    print(f"Machine: {machine_line()}\n")
    print("| step of a full create (ms) | p50 | p99 |\n|---|---|---|")
    for name, values in steps.items():
        print(f"| {name} | {median(values):.1f} | {percentile(values, 99):.1f} |")


if __name__ == "__main__":
    main()
