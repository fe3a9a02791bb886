"""A machine's cgroups: where its memory cgroup is, how many OOM kills it saw, the cpu it
used, and its freezer. cgroup v1 (a hierarchy per controller, as on this host) and v2
(one unified hierarchy) both; limits are the runtime's job (config.json)."""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def controller_dir(pid: int, controller: str) -> Path | None:
    """The cgroup directory of process `pid` for `controller` ("memory", "cpuacct",
    "freezer"...), v1 or v2; None if the process is gone or the controller unknown."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    unified = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return CGROUP_ROOT / controller / path.lstrip("/")
        if controllers == "":
            unified = path
    if unified is not None and (CGROUP_ROOT / "cgroup.controllers").exists():
        return CGROUP_ROOT / unified.lstrip("/")
    return None


def oom_kills(memory_dir: Path) -> int:
    """Processes the kernel's OOM killer ended in this memory cgroup (0 if unreadable)."""
    for name in ("memory.oom_control", "memory.events"):  # v1, v2
        try:
            text = (memory_dir / name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    return 0


def cpu_usage_s(cpu_dir: Path) -> float:
    """CPU time used by every process of the cgroup, in seconds."""
    usage = cpu_dir / "cpuacct.usage"  # v1, nanoseconds
    if usage.exists():
        return int(usage.read_text()) / 1e9
    for line in (cpu_dir / "cpu.stat").read_text().splitlines():  # v2
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value) / 1e6
    raise OSError(f"no cpu usage under {cpu_dir}")


def swap_accounted() -> bool:
    """Can memory + swap be limited (v1 memsw, or v2's memory.swap.max)?"""
    return (CGROUP_ROOT / "memory" / "memory.memsw.limit_in_bytes").exists() or (
        CGROUP_ROOT / "cgroup.controllers").exists()


def freezer_file(pid: int) -> tuple[Path, str, str] | None:
    """(file, frozen value, thawed value) of the machine's freezer, v1 or v2."""
    directory = controller_dir(pid, "freezer")
    if directory is None:
        return None
    if (directory / "freezer.state").exists():
        return directory / "freezer.state", "FROZEN", "THAWED"
    if (directory / "cgroup.freeze").exists():
        return directory / "cgroup.freeze", "1", "0"
    return None


def freezer_reads(path: Path, value: str) -> bool:
    """The freezer says `value` (v2's cgroup.freeze is read back from cgroup.events)."""
    if path.name == "cgroup.freeze":
        events = (path.parent / "cgroup.events").read_text().split()
        return events[events.index("frozen") + 1] == value
    return path.read_text().strip() == value
