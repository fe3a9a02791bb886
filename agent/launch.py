"""Where a machine lives on this host: its directory, its recorded run, how it is launched."""

from __future__ import annotations

from pathlib import Path

from agent.core.runplan import RunPlan, run_plan
from agent.core.state import Machine
from agent.driverport import LaunchSpec, Running
from ground.statefiles import private_dir
from imagecache.api import Image


def running(machine: Machine, default_host: str) -> Running:
    """The machine's recorded run (it has a process)."""
    assert machine.process is not None
    proc = machine.process
    return Running(proc.runtime_id, proc.pid, proc.start_time, proc.host or default_host,
                   proc.port)


def machine_dir(state_dir: Path, mid: str) -> Path:
    return state_dir / "machines" / mid


def plan(machine: Machine, image: Image, secrets: dict[str, str] | None = None) -> RunPlan:
    """What the machine runs (NothingToRun if the image and its spec say nothing)."""
    return run_plan(machine.id, machine.spec, image.config, secrets)


def launch_spec(machine: Machine, image: Image, state_dir: Path,
                secrets: dict[str, str] | None = None) -> LaunchSpec:
    """`secrets`: the app's, unsealed just now: in the LaunchSpec's env only."""
    what = plan(machine, image, secrets)
    directory = machine_dir(state_dir, machine.id)
    private_dir(directory)
    return LaunchSpec(
        machine_id=machine.id,
        app=machine.spec.app,
        argv=what.argv,
        env=what.env,
        rootfs=Path(image.rootfs),
        workdir=what.workdir,
        user=what.user,
        port=what.port,
        cpus=machine.spec.guest.cpus,
        memory_mb=machine.spec.guest.memory_mb,
        machine_dir=directory,
    )
