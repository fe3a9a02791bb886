"""Losing a host under load: which worker, and how it is killed.

The victim is the worker running a started machine of the app under test (or the one
named). Two ways to kill it:

- a command (`--kill-cmd`): run with `sh -c` at the kill time, `{worker}` and `{url}`
  replaced by the worker's id and its agent's URL — for a deployment on other hosts
  (`ssh {worker} sudo systemctl kill -s KILL thaw-agent`, a cloud API call, …);
- on this host (the default): the worker's agent must be a `thaw agent` process here,
  listening on the loopback port of its URL. That process is found through /proc (the
  socket's inode), and it and every machine of that worker (their process groups, pids
  from the API) get SIGKILL at once: what a host that loses power leaves behind. Under
  `thaw up` every agent lives in one process, which is refused (it is the whole platform):
  run the services separately, e.g. `python -m loadtests.kit.separate`.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Victim:
    worker: str
    url: str
    machine_pids: tuple[int, ...]  # every machine of the worker, all apps
    machine_ids: tuple[str, ...]


def choose_victim(app: str, workers: list[dict[str, Any]],
                  machines_by_app: dict[str, list[dict[str, Any]]], worker: str = "") -> Victim:
    """The named worker, else the worker of the app's first started machine."""
    if not worker:
        started = [m for m in machines_by_app.get(app, []) if m.get("state") == "started"]
        if not started:
            raise ValueError(f"{app} has no started machine: no worker to kill")
        worker = str(started[0]["worker"])
    urls = {str(w["id"]): str(w.get("url", "")) for w in workers}
    if worker not in urls:
        raise ValueError(f"no worker {worker!r} (workers: {', '.join(sorted(urls))})")
    on_it = [m for ms in machines_by_app.values() for m in ms if m.get("worker") == worker]
    pids = sorted({int(m.get("pid") or 0) for m in on_it} - {0})
    return Victim(worker, urls[worker], tuple(pids), tuple(sorted(str(m["id"]) for m in on_it)))


def listening_inodes(tables: list[str], port: int) -> set[str]:
    """Inodes of sockets listening on `port` in /proc/net/tcp{,6} tables' text."""
    found = set()
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1],
                                                                16) == port:
                found.add(fields[9])
    return found


def pid_listening_on(port: int, proc: Path = Path("/proc")) -> int:
    """The pid of the process here that listens on TCP `port` (0: none found)."""
    tables = []
    for name in ("tcp", "tcp6"):
        try:
            tables.append((proc / "net" / name).read_text())
        except OSError:
            pass
    targets = {f"socket:[{inode}]" for inode in listening_inodes(tables, port)}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in targets for fd in (entry / "fd").iterdir()):
                return int(entry.name)
        except OSError:
            continue
    return 0


def local_agent_pid(victim: Victim, proc: Path = Path("/proc")) -> int:
    parts = urlsplit(victim.url)
    if parts.hostname not in LOOPBACK or not parts.port:
        raise ValueError(f"worker {victim.worker} is at {victim.url}, not on this host: "
                         "pass --kill-cmd")
    pid = pid_listening_on(parts.port, proc)
    if not pid:
        raise ValueError(f"no process of this user listens on {victim.url} "
                         f"(worker {victim.worker}): pass --kill-cmd")
    argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    if b"agent" not in argv:
        raise ValueError(f"worker {victim.worker} is served by pid {pid} "
                         f"({b' '.join(argv).decode(errors='replace')[:80]}), not a "
                         "`thaw agent` of its own: host-loss needs the services as "
                         "separate processes (python -m loadtests.kit.separate), or --kill-cmd")
    return pid


def machine_processes(machine_ids: set[str], proc: Path = Path("/proc")) -> list[int]:
    """Processes here whose environment names one of the machines (THAW_MACHINE_ID): what
    a sandbox started below the pid the agent knows."""
    found = []
    for entry in proc.iterdir():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if any(item.startswith(b"THAW_MACHINE_ID=") and item[16:].decode() in machine_ids
               for item in environ):
            found.append(int(entry.name))
    return found


def kill_locally(victim: Victim, agent_pid: int) -> None:
    """SIGKILL the agent, then every machine's process group (each runs in its own) and
    any process left that carries one of the machines' ids."""
    os.kill(agent_pid, signal.SIGKILL)
    for pid in [*victim.machine_pids, *machine_processes(set(victim.machine_ids))]:
        sigkill_group(pid)


def sigkill_group(pid: int) -> None:
    """SIGKILL the process group `pid` leads (a machine runs in its own session), else
    `pid` alone; one already gone is fine."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_by_command(victim: Victim, command: str, timeout_s: float = 60.0) -> None:
    text = command.replace("{worker}", victim.worker).replace("{url}", victim.url)
    done = subprocess.run(["sh", "-c", text], timeout=timeout_s, check=False,
                          env={**os.environ, "THAW_WORKER": victim.worker})
    if done.returncode != 0:
        raise RuntimeError(f"--kill-cmd exited {done.returncode}: {text}")
