"""The bubblewrap driver (and, with no sandbox at all, the plain-process driver): for hosts
without root or without an OCI runtime. A machine is a process session (agent.driver)
running the image's own tree as `/` in a user namespace with no capabilities. It is NOT
a boundary between tenants: it shares the host's network (the app must listen on $PORT,
a port the agent picked on the host), has no cgroup limits, and the plain-process form
runs the app on the host's userland with the image's tree as its working directory.
"""

from __future__ import annotations

import logging
import signal as signals
from pathlib import Path

from agent.core.exits import describe_returncode
from agent.core.imageuser import BadUser, resolve_user
from agent.driver import ProcessDriver, ProcessIdentity, ProcessLaunch, allocate_port
from agent.driverport import LaunchSpec, Running
from agent.oci.rootfiles import read_in_root
from agent.ready import ReadyResult

log = logging.getLogger("thaw.agent")


class ProcessMachines:
    isolated = False

    def __init__(self, *, sandbox: bool | None, host: str = "127.0.0.1") -> None:
        """sandbox: True = bubblewrap (RuntimeError if unusable), False = plain process,
        None = bubblewrap iff it works here."""
        self.processes = ProcessDriver(sandbox=sandbox)
        self.host = host
        self.name = "bubblewrap" if self.processes.sandboxed else "process"

    async def prepare(self, spec: LaunchSpec) -> None:
        return  # nothing outlives a process here

    async def launch(self, spec: LaunchSpec) -> Running:
        port = allocate_port(self.host)
        uid = gid = 0
        if self.processes.sandboxed:
            try:
                user = resolve_user(spec.user, read_in_root(spec.rootfs, "/etc/passwd") or "",
                                    read_in_root(spec.rootfs, "/etc/group") or "")
            except BadUser as exc:
                raise OSError(str(exc)) from None
            uid, gid = user.uid, user.gid
        launch = ProcessLaunch(
            machine_id=spec.machine_id, argv=spec.argv, env={**spec.env, "PORT": str(port)},
            rootfs=spec.rootfs, workdir=spec.workdir, log_path=spec.output, uid=uid, gid=gid)
        ident = await self.processes.launch_off_loop(launch)
        return Running("", ident.pid, ident.start_time, self.host, port)

    def alive(self, run: Running) -> bool:
        return self.processes.alive(_ident(run))

    def exit_reason(self, run: Running) -> str:
        return describe_returncode(self.processes.returncode(_ident(run)))

    def signal(self, run: Running, sig: int) -> bool:
        return self.processes.signal(_ident(run), sig)

    async def suspend(self, run: Running) -> bool:
        ident = _ident(run)
        if not self.processes.suspend(ident):
            return False
        await self.processes.wait_stopped(ident)  # answered "suspended" once it is
        return True

    async def resume(self, run: Running) -> bool:
        return self.processes.resume(_ident(run))

    async def stop(self, run: Running, kill_signal: int, kill_timeout_s: float) -> None:
        await self.processes.stop(_ident(run), kill_signal, kill_timeout_s)

    async def exited(self, machine_id: str, machine_dir: Path) -> None:
        return

    async def destroy(self, machine_id: str, machine_dir: Path) -> None:
        return

    async def wait_ready(self, run: Running, health_path: str | None,
                         timeout_s: float, *, h2c: bool = False) -> ReadyResult:
        return await self.processes.wait_ready(_ident(run), run.host, run.port, health_path,
                                               timeout_s, h2c=h2c)

    async def adopt(self, machines_dir: Path, recorded: dict[str, Running | None]) -> None:
        """Kill each machine session of this agent's that its op log does not record."""
        for mid, session in self.processes.own_sessions(machines_dir):
            run = recorded.get(mid)
            if run is not None and (run.pid, run.start_time) == (session.pid,
                                                                 session.start_time):
                continue
            why = ("its machine is not in the op log" if mid not in recorded else
                   "the op log records another process for it" if run is not None else
                   "the op log records no process for it")
            _log_kill(mid, session.pid, why)
            await self.processes.stop(session, signals.SIGKILL, 0)

    async def release_all(self, machines_dir: Path) -> None:
        return  # nothing but processes, and they are gone

    async def end_strays(self, machines_dir: Path, machine_id: str) -> None:
        """Kill every process of the machine that outlived its group (a setsid child, a
        daemon). In a sandbox its pid namespace ends them; without one nothing else would."""
        if self.processes.sandboxed:
            return
        strays = self.processes.processes_of(machines_dir, machine_id)
        if strays:
            _log_kill(machine_id, strays[0].pid,
                      f"{len(strays)} processes left behind outside its group")
            await self.processes.kill_all(strays)


def _ident(run: Running) -> ProcessIdentity:
    return ProcessIdentity(run.pid, run.start_time)


def _log_kill(machine_id: str, pid: int, why: str) -> None:
    log.warning("machine %s: killing process %d: %s", machine_id, pid, why)
