"""Which driver tests run machines under, and the cleanup of what a machine leaves on
the host (containers, mounts, network namespaces, claims) when an agent could not.

THAW_TEST_DRIVER picks the driver (auto: the OCI driver as root, the default); `make
test` runs the driver-independent tests once more under bubblewrap.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from agent import drivers
from agent.config import AgentConfig
from agent.drivers import oci_missing
from tests.support.credentials import RING

TEST_DRIVER = os.environ.get("THAW_TEST_DRIVER", "auto")


def oci_driver_runs() -> bool:
    """The tests' agents run machines as OCI containers."""
    return TEST_DRIVER in ("auto", "oci") and not oci_missing("runc")


def sweep(state_dir: Path) -> None:
    """Destroy every machine an agent with this state dir left on the host (after the
    agent is gone: a kill -9, a test that failed half way)."""
    if oci_driver_runs():
        asyncio.run(drivers.sweep(AgentConfig(state_dir=state_dir, cluster_keys=RING)))


def frozen(pid: int) -> bool:
    """The machine process `pid` is suspended: its freezer cgroup FROZEN (a container, by
    the runtime's pause) or the process stopped (SIGSTOP, the process drivers)."""
    from agent.oci.cgroups import controller_dir

    freezer = controller_dir(pid, "freezer")
    state = freezer / "freezer.state" if freezer is not None else None
    if state is not None and state.exists() and state.read_text().strip() == "FROZEN":
        return True
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def app_rootfs(work: Path, name: str, files: dict[str, str], base: str = "builtin:python3",
               workdir: str = "/srv") -> Path:
    """The unpacked tree of an image FROM `base` with `files` in `workdir`, as an agent's
    image cache makes it (for driver tests that run a tree without an agent)."""
    from imagecache.cache import ImageCache
    from imagecache.core.egress import EgressPolicy
    from thaw.imagebuild import BuildOverrides, build_image

    source = work / f"{name}-src"
    source.mkdir(parents=True)
    for rel, text in files.items():
        (source / rel).write_text(text)
    layout = work / f"{name}-layout"
    build_image(source, f"{name}:v1", layout=layout,
                overrides=BuildOverrides(base=base, workdir=workdir))

    policy = EgressPolicy.build(layout_dirs=[str(work.resolve())])

    async def pull() -> Path:
        cache = ImageCache(work / f"{name}-cache", budget_bytes=1 << 30, policy=policy)
        try:
            return Path((await cache.pull(f"oci:{layout}:{name}:v1")).rootfs)
        finally:
            await cache.close()

    return asyncio.run(pull())
