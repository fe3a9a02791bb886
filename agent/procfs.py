"""Read-only views of /proc used by the process driver.

Everything here reads the host's /proc as the agent sees it: pids, process
groups and sessions are in the agent's pid namespace, so a sandboxed
machine's processes show with their host pids. A process may vanish between
any two reads; every reader returns ``None`` (or skips it) instead of raising.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

PROC = "/proc"


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat the driver needs."""

    pid: int
    state: str  # one letter: R S D T t Z X I ...
    ppid: int
    pgrp: int
    session: int
    start_time: int  # field 22: clock ticks after boot; fixed for the life of the process

    @property
    def zombie(self) -> bool:
        """Exited, waiting to be reaped (or being torn down): not a running process."""
        return self.state in ("Z", "X", "x")


def parse_stat(pid: int, raw: bytes) -> ProcStat:
    """Parse one /proc/<pid>/stat line; comm (field 2) may hold spaces and ')'."""
    rest = raw[raw.rindex(b")") + 2 :].split()
    return ProcStat(
        pid=pid,
        state=rest[0].decode(),
        ppid=int(rest[1]),
        pgrp=int(rest[2]),
        session=int(rest[3]),
        start_time=int(rest[19]),
    )


def read_stat(pid: int) -> ProcStat | None:
    """The process's stat, or None if there is no such process (any more)."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return parse_stat(pid, raw)


def pids() -> Iterator[int]:
    """Every process (thread-group leader) visible in /proc, in no order."""
    for name in os.listdir(PROC):
        if name.isdigit():
            yield int(name)


def stats() -> Iterator[ProcStat]:
    """The stat of every visible process; processes that vanish are skipped."""
    for pid in pids():
        stat = read_stat(pid)
        if stat is not None:
            yield stat


def group_members(pgid: int) -> list[ProcStat]:
    """Every process in process group ``pgid``, zombies included."""
    return [stat for stat in stats() if stat.pgrp == pgid]


def environ_value(pid: int, name: str) -> str | None:
    """The value of ``name`` in the process's initial environment, if readable."""
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for entry in raw.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")
    return None


def fd_target(pid: int, fd: int) -> str | None:
    """Where the process's file descriptor `fd` points (a path), if readable."""
    try:
        return os.readlink(f"{PROC}/{pid}/fd/{fd}")
    except OSError:
        return None


def exe_name(pid: int) -> str | None:
    """Basename of the executable the process runs (None for zombies or if unreadable)."""
    try:
        return os.path.basename(os.readlink(f"{PROC}/{pid}/exe"))
    except OSError:
        return None
