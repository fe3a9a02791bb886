"""The OCI driver: a machine is a container run by an OCI runtime (runc by default).

Per machine, under its directory: `bundle/config.json` (agent.core.ocispec), its writable
layer (`upper/`), and `slots.json` (its claims, host-wide: a user-id range and a /31 of
the address pool; agent.oci.claims); under the host's run dir, its mounted rootfs (the
image's tree idmapped into the machine's id range as the lower layer of an overlay;
agent.oci.mounts) and its `hosts`/`hostname`; its network namespace under /run/netns
(agent.oci.netns). `prepare` makes all of that and has the runtime *create* the container
(its init waits before the app's exec); `launch` is then only the runtime's `start`. A
stopped machine is prepared again at once, so its next start is as quick as a spare's.

The agent is a child subreaper: a container's init, orphaned when `runtime create`
exits, is reaped here, so its exit status is known (and an OOM kill is read from its
memory cgroup before the runtime deletes it). After an agent restart the inits of
running machines belong to pid 1; they are watched by pid and start time as before, and
an exit nobody here could reap is `exited(?)` (or `oom` when the cgroup says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal as signals
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from agent import procfs
from agent.core.exits import describe_exit
from agent.core.imageuser import BadUser
from agent.core.machinenet import Egress
from agent.driverport import LaunchSpec, Running
from agent.oci import cgroups, egress, netns
from agent.oci.bundle import MachineFiles, machine_dirs, same_config, write_config
from agent.oci.runtime import ContainerState, Runtime, RuntimeFailure
from agent.outputs import writer_fd
from agent.ready import BACKOFF, FIRST_POLL_S, MAX_POLL_S, ReadyResult, wait_ready
from agent.subreaper import become_child_subreaper
from imagecache.adapters.trees import remove_tree_quietly

log = logging.getLogger("thaw.agent")
T = TypeVar("T")

DEFAULT_RUN_DIR = Path("/run/thaw")
DEFAULT_PIDS_MAX = 1024
_KILL_RETRY_S = 1.0
_FREEZE_POLLS = 1000  # 1 ms apart


@dataclass(frozen=True)
class Prepared:
    """A created container: its init waits for the runtime's `start`."""

    spec: LaunchSpec
    pid: int
    start_time: int
    memory_dir: Path | None
    address: str


class OciDriver:
    isolated = True

    def __init__(self, state_dir: Path, *, runtime: str = "runc",
                 machine_cidr: str = netns.DEFAULT_CIDR,
                 run_dir: Path = DEFAULT_RUN_DIR, pids_max: int = DEFAULT_PIDS_MAX,
                 machine_egress: Egress = Egress.PUBLIC) -> None:
        """`run_dir`: host-wide, on tmpfs: the claims every agent of the host shares, and
        the machines' mounted trees (`roots/<machine id>`). `machine_egress`: what its
        machines may open outside (agent.core.machinenet)."""
        self.runtime = Runtime(runtime, state_dir / "runtime")
        self.name = f"oci/{self.runtime.name}"
        self.files = MachineFiles(run_dir, machine_cidr, pids_max, machine_egress)
        self.egress = machine_egress
        self._run_dir = run_dir
        self._egress_installed = False
        self._exits: dict[int, int] = {}  # pid -> wait status, for inits reaped here
        self._memory_dirs: dict[int, Path] = {}  # pid -> its memory cgroup, read while alive
        self._locks: dict[str, asyncio.Lock] = {}  # machine id -> its operations, one by one
        self._prepared: dict[str, Prepared] = {}  # machine id -> its created container
        become_child_subreaper()

    # -- making and starting ------------------------------------------------------------

    async def prepare(self, spec: LaunchSpec) -> None:
        await self._one_at_a_time(spec.machine_id, self._prepare(spec))

    async def launch(self, spec: LaunchSpec) -> Running:
        return await self._one_at_a_time(spec.machine_id, self._launch(spec))

    async def exited(self, machine_id: str, machine_dir: Path) -> None:
        await self._one_at_a_time(machine_id, self._exited(machine_id, machine_dir))

    async def destroy(self, machine_id: str, machine_dir: Path) -> None:
        await self._one_at_a_time(machine_id, self._destroy(machine_id, machine_dir))
        self._locks.pop(machine_id, None)  # gone: nothing of it is done again

    async def _one_at_a_time(self, machine_id: str, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` alone among this machine's driver operations, to its end: a caller
        cancelled meanwhile (a stop cancels a start) waits for it before giving up, so the
        next operation never meets a half-made mount, namespace or container."""
        lock = self._locks.setdefault(machine_id, asyncio.Lock())
        async with lock:
            task = asyncio.ensure_future(work)
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                await asyncio.wait([task])
                if not task.cancelled() and task.exception() is not None:
                    log.info("machine %s: %s (its caller had gone)", machine_id,
                             task.exception())
                raise

    async def _prepare(self, spec: LaunchSpec) -> Prepared:
        known = self._prepared.get(spec.machine_id)
        if known is not None and known.spec == spec and self._still_created(known):
            return known  # as this driver left it: nothing to look at again
        config = await asyncio.to_thread(self.files.materialise, spec)
        link = self.files.link(spec.machine_id, spec.machine_dir)
        bundle = spec.machine_dir / "bundle"
        state = await self.runtime.state(spec.machine_id)
        if state is not None and state.status == "created" and same_config(bundle, config):
            if not netns.exists(link):  # an agent stopped between create and link
                await self._link_up(link, state.pid)
            return self._remember(spec, state.pid)
        if state is not None:
            await self._delete(spec.machine_id)
        write_config(bundle, config)
        fd = writer_fd(spec.output)
        try:
            pid = await self.runtime.create(spec.machine_id, bundle, fd)
        finally:
            os.close(fd)
        await self._link_up(link, pid)
        return self._remember(spec, pid)

    async def _link_up(self, link: netns.Link, pid: int) -> None:
        """Link the created container `pid` to the host and give it its egress (the two
        side by side; the host's table made first, once)."""
        if not self._egress_installed:
            await egress.install(self._run_dir)
            self._egress_installed = True
        await asyncio.gather(netns.create(link, pid), egress.allow(link.machine_ip,
                                                                   self.egress))

    async def _link_down(self, link: netns.Link) -> None:
        await asyncio.gather(netns.remove(link), egress.drop(link.machine_ip))

    def _remember(self, spec: LaunchSpec, pid: int) -> Prepared:
        stat = procfs.read_stat(pid)
        if stat is None:
            raise RuntimeFailure(f"container {spec.machine_id}: its init has gone")
        prepared = Prepared(spec, pid, stat.start_time, cgroups.controller_dir(pid, "memory"),
                            self.files.link(spec.machine_id, spec.machine_dir).machine_ip)
        self._prepared[spec.machine_id] = prepared
        return prepared

    def _still_created(self, prepared: Prepared) -> bool:
        """Its init still waits for `start` (same pid and start time, not a zombie)."""
        stat = procfs.read_stat(prepared.pid)
        return stat is not None and not stat.zombie and stat.start_time == prepared.start_time

    async def _launch(self, spec: LaunchSpec) -> Running:
        try:
            prepared = await self._prepare(spec)
            self._prepared.pop(spec.machine_id, None)  # started: no longer waiting
            await self.runtime.start(spec.machine_id)
        except (BadUser, FileNotFoundError) as exc:
            raise OSError(str(exc)) from None
        if prepared.memory_dir is not None:
            self._memory_dirs[prepared.pid] = prepared.memory_dir
        return Running(spec.machine_id, prepared.pid, prepared.start_time, prepared.address,
                       spec.port)

    # -- watching ------------------------------------------------------------------------

    def alive(self, run: Running) -> bool:
        stat = procfs.read_stat(run.pid)
        if stat is None or stat.start_time != run.start_time:
            return False
        if stat.zombie:
            self._reap(run.pid)
            return False
        return True

    def exit_reason(self, run: Running) -> str:
        memory_dir = self._memory_dirs.pop(run.pid, None)
        oom = memory_dir is not None and cgroups.oom_kills(memory_dir) > 0
        return describe_exit(self._exits.pop(run.pid, None), oom)

    def _reap(self, pid: int) -> None:
        try:
            reaped, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return  # not ours (adopted after a restart): its status is lost
        if reaped == pid:
            self._exits[pid] = status

    def signal(self, run: Running, sig: int) -> bool:
        if not self.alive(run):
            return False
        try:
            os.kill(run.pid, sig)  # the container's init: pid 1 of its namespace
        except ProcessLookupError:
            return False
        return True

    async def suspend(self, run: Running) -> bool:
        return await self._freeze(run, frozen=True)

    async def resume(self, run: Running) -> bool:
        return await self._freeze(run, frozen=False)

    async def _freeze(self, run: Running, frozen: bool) -> bool:
        """Freeze or thaw every process of the machine through its freezer cgroup: what
        the runtime's pause and resume write (its state reads the same file back), without
        the runtime's exec (~7 ms, on the path of a resumed request). The runtime's own
        command where the freezer is not found."""
        if not self.alive(run):
            return False
        found = cgroups.freezer_file(run.pid)
        if found is None:
            call = self.runtime.pause if frozen else self.runtime.resume
            return await self._runtime_call(run, call)
        path, on, off = found
        want = on if frozen else off
        try:
            path.write_text(want)
            for _ in range(_FREEZE_POLLS):  # v1 passes FREEZING on its way to FROZEN
                if cgroups.freezer_reads(path, want):
                    return True
                await asyncio.sleep(0.001)
        except OSError as exc:
            log.warning("machine %s: freezer %s: %s", run.runtime_id, path, exc)
        return False

    async def _runtime_call(self, run: Running, call: Any) -> bool:
        if not self.alive(run):
            return False
        try:
            await call(run.runtime_id)
        except RuntimeFailure as exc:
            log.warning("machine %s: %s", run.runtime_id, exc)
            return False
        return True

    async def stop(self, run: Running, kill_signal: int, kill_timeout_s: float) -> None:
        if not self.alive(run):
            return
        await self._freeze(run, frozen=False)  # a frozen machine's handler runs too
        self.signal(run, kill_signal)
        if await self._gone(run, kill_timeout_s):
            return
        while True:  # SIGKILL to the init of a pid namespace ends every process in it
            self.signal(run, signals.SIGKILL)
            if await self._gone(run, _KILL_RETRY_S):
                return

    async def _gone(self, run: Running, timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        interval = FIRST_POLL_S
        while self.alive(run):
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(interval)
            interval = min(interval * BACKOFF, MAX_POLL_S)
        return True

    async def wait_ready(self, run: Running, health_path: str | None,
                         timeout_s: float, *, h2c: bool = False) -> ReadyResult:
        return await wait_ready(lambda: self.alive(run), run.host, run.port, health_path,
                                timeout_s, h2c=h2c)

    # -- cleaning up ---------------------------------------------------------------------

    async def _delete(self, machine_id: str) -> None:
        """Delete the machine's container; the init of one this driver created and never
        started is its child: reaped here, or it would stay a zombie. A runtime that
        cannot delete it (one cut short mid-create by a kill -9) is logged, not raised:
        cleaning one machine up must not stop the agent or its other machines; the next
        create of the machine deletes it again."""
        prepared = self._prepared.pop(machine_id, None)
        try:
            await self.runtime.delete(machine_id, force=True)
        except RuntimeFailure as exc:
            log.warning("machine %s: its container could not be deleted: %s", machine_id, exc)
        if prepared is not None:
            await _reap_exactly(prepared.pid, prepared.start_time)

    async def _exited(self, machine_id: str, machine_dir: Path) -> None:
        await self._delete(machine_id)
        if self.files.has_slots(machine_dir):  # its namespace went with its init
            await self._link_down(self.files.link(machine_id, machine_dir))

    async def _destroy(self, machine_id: str, machine_dir: Path) -> None:
        await self._exited(machine_id, machine_dir)
        await asyncio.to_thread(self.files.unmount, machine_id, machine_dir)
        self.files.release(machine_id, machine_dir)
        await asyncio.to_thread(remove_tree_quietly, machine_dir / "bundle")

    async def adopt(self, machines_dir: Path, recorded: dict[str, Running | None]) -> None:
        """Delete every container of this agent's runtime root that is not a recorded run
        or a prepared (created) container of a recorded machine; destroy what is left of
        machines the op log does not know."""
        for state in await self._containers():
            if state.id in recorded:
                run = recorded[state.id]
                if run is not None and run.pid == state.pid and self.alive(run):
                    self._remember_memory_dir(run)
                    continue
                if run is None and state.status == "created":
                    continue  # prepared for its next start
            log.warning("machine %s: deleting container (%s): the op log does not record it",
                        state.id, state.status)
            await self._delete(state.id)
        for directory in machine_dirs(machines_dir):
            if directory.name not in recorded:
                await self.destroy(directory.name, directory)

    async def _containers(self) -> list[ContainerState]:
        """Every container of this agent's runtime root ([] and a warning if the runtime
        cannot list them: an agent still starts)."""
        try:
            return await self.runtime.list()
        except RuntimeFailure as exc:
            log.warning("the runtime cannot list this agent's containers: %s", exc)
            return []

    def _remember_memory_dir(self, run: Running) -> None:
        memory_dir = cgroups.controller_dir(run.pid, "memory")
        if memory_dir is not None:
            self._memory_dirs[run.pid] = memory_dir

    async def end_strays(self, machines_dir: Path, machine_id: str) -> None:
        return  # a pid namespace: nothing of the machine outlives its init

    async def release_all(self, machines_dir: Path) -> None:
        """The agent stops and its machines with it: delete every container, unmount every
        rootfs and remove every namespace; the machines' upper layers and claims stay (a
        later agent mounts them again)."""
        for state in await self._containers():
            await self._delete(state.id)
        for directory in machine_dirs(machines_dir):
            await self._link_down(self.files.link(directory.name, directory))
            await asyncio.to_thread(self.files.unmount, directory.name, directory)

    async def sweep(self, machines_dir: Path) -> None:
        """Destroy everything of every machine under `machines_dir` on this host (a dead
        agent's, for cleanup): containers, namespaces, mounts, claims."""
        for state in await self._containers():
            await self._delete(state.id)
        for directory in machine_dirs(machines_dir):
            await self.destroy(directory.name, directory)


async def _reap_exactly(pid: int, start_time: int) -> None:
    """Reap our child `pid` once it is a zombie, if it is still the process that started
    at `start_time` (never a later process that reused the pid); a short wait at most."""
    for _ in range(50):
        stat = procfs.read_stat(pid)
        if stat is None or stat.start_time != start_time or stat.ppid != os.getpid():
            return
        if stat.zombie:
            _reap_zombie(pid)
            return
        await asyncio.sleep(0.01)


def _reap_zombie(pid: int) -> None:
    """waitpid of a child already a zombie: returns at once."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
