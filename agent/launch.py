"""Where a machine lives on this host: its directory, its process, how it is launched."""

from __future__ import annotations

from pathlib import Path

from agent.core.state import Machine
from agent.driver import LaunchSpec, ProcessIdentity
from imagecache.api import Image


def ident(machine: Machine) -> ProcessIdentity:
    assert machine.process is not None
    return ProcessIdentity(machine.process.pid, machine.process.start_time)


def machine_dir(state_dir: Path, mid: str) -> Path:
    return state_dir / "machines" / mid


def launch_spec(machine: Machine, image: Image, port: int, state_dir: Path) -> LaunchSpec:
    env = dict(kv.split("=", 1) for kv in image.config.env if "=" in kv)
    env.update(machine.spec.env)
    env.update(PORT=str(port), THAW_APP=machine.spec.app, THAW_MACHINE_ID=machine.id)
    argv = [*image.config.entrypoint, *image.config.cmd]
    directory = machine_dir(state_dir, machine.id)
    directory.mkdir(parents=True, exist_ok=True)
    return LaunchSpec(
        machine_id=machine.id,
        argv=argv,
        env=env,
        rootfs=Path(image.rootfs),
        workdir=image.config.working_dir,
        log_path=directory / "log",
    )
