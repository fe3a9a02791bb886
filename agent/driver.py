"""The process engine under the bubblewrap and plain-process drivers
(`agent.sandboxdriver`): a machine is a process session on this host.

Each machine is started in its own session (so its process group id is its
pid), with stdin from /dev/null and stdout+stderr appended to a log file. It
is not tied to the agent: an agent killed with -9 leaves its machines
running, and a new agent re-adopts them by ``ProcessIdentity`` (pid plus the
start time from /proc, which guards against pid reuse).

With bubblewrap, the session leader is the outer ``bwrap`` (the "wrapper");
inside its pid namespace bwrap's own init is pid 1 and the app is pid 2.
Signals other than SIGSTOP/SIGCONT therefore go to every process of the group
except the wrapper (see docs/process-driver.md for why).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal as signals
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from agent import procfs
from agent.ready import BACKOFF, FIRST_POLL_S, MAX_POLL_S, ReadyResult, wait_ready
from agent.sandbox import sandbox_argv
from agent.subreaper import become_child_subreaper
from ground.statefiles import open_private

MACHINE_ID_ENV = "THAW_MACHINE_ID"
MACHINE_DIR_ENV = "THAW_MACHINE_DIR"  # the agent's dir of the machine: whose machine it is
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
WRAPPER_EXE = "bwrap"

_SANDBOX_PROBE_S = 5.0
SUSPEND_WAIT_S = 1.0  # a suspend waits this long at most for its processes to stop
_KILL_RETRY_S = 1.0


@dataclass(frozen=True)
class ProcessLaunch:
    machine_id: str
    argv: list[str]  # entrypoint + cmd; argv[0] may be a bare name resolved via env PATH
    env: dict[str, str]  # full environment; THAW_MACHINE_ID and a default PATH are added
    rootfs: Path  # unpacked image root
    workdir: str  # image WorkingDir ("" = root of the image)
    log_path: Path  # stdout+stderr appended here (O_APPEND)
    uid: int = 0  # inside the sandbox's user namespace (ignored without a sandbox)
    gid: int = 0


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    start_time: int  # field 22 of /proc/<pid>/stat (clock ticks since boot)


class ProcessDriver:
    """Starts, signals, watches and stops machine processes; adopts survivors."""

    def __init__(self, *, sandbox: bool | None = None) -> None:
        """sandbox: True = bubblewrap (RuntimeError if unusable), False = plain
        process, None = bubblewrap iff it is installed and a probe run works."""
        self._bwrap = shutil.which(WRAPPER_EXE)
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._dying: set[int] = set()  # groups whose leader died with members not yet reaped
        self._returncodes: dict[int, int] = {}  # leaders reaped here: how they ended
        self._sandboxed = sandbox is not False and self._probe_sandbox()
        if sandbox and not self._sandboxed:
            raise RuntimeError("sandbox requested but bubblewrap is missing or does not work")

    @property
    def sandboxed(self) -> bool:
        return self._sandboxed

    def launch(self, spec: ProcessLaunch) -> ProcessIdentity:
        """Start the machine; returns once it is forked (does not wait for readiness).
        Raises OSError if the process cannot be started (outside the sandbox, a
        missing executable raises here; inside, it shows up as an early exit)."""
        return self._record(_popen(*self._command(spec)))

    async def launch_off_loop(self, spec: ProcessLaunch) -> ProcessIdentity:
        """`launch`, with the fork and exec in a thread: `Popen` waits until the child
        has exec'd (bubblewrap included), which held the agent's loop ~16 % of the time
        in a herd of starts. Cancelled meanwhile, the process it made is killed."""
        command = self._command(spec)
        made = asyncio.get_running_loop().run_in_executor(None, _popen, *command)
        try:
            proc = await asyncio.shield(made)
        except asyncio.CancelledError:
            made.add_done_callback(self._discard)
            raise
        return self._record(proc)

    def _discard(self, made: asyncio.Future[subprocess.Popen[bytes]]) -> None:
        """A process launched for a start that was cancelled: recorded nowhere, killed."""
        if made.cancelled() or made.exception() is not None:
            return
        proc = made.result()
        self._children[proc.pid] = proc  # reaped by a later launch, and
        self._dying.add(proc.pid)  # the rest of its group (a sandbox's init) with it
        _kill_group(proc.pid)

    def _command(self, spec: ProcessLaunch) -> tuple[list[str], Path, dict[str, str], Path]:
        """The argv, working directory, environment and log of the machine's process."""
        self._reap_finished_children()
        rel_workdir = os.path.normpath("/" + spec.workdir).lstrip("/")
        cwd = spec.rootfs / rel_workdir if rel_workdir else spec.rootfs
        if not cwd.is_dir():
            raise FileNotFoundError(f"working directory {spec.workdir!r} is not in the image")
        if self._sandboxed:
            assert self._bwrap is not None
            argv = sandbox_argv(self._bwrap, spec.rootfs, rel_workdir, spec.machine_id,
                                spec.uid, spec.gid)
            argv += spec.argv
            cwd = Path("/")
        else:
            argv = list(spec.argv)
        return argv, cwd, machine_env(spec), spec.log_path

    def alive(self, ident: ProcessIdentity) -> bool:
        """The machine's leader exists, is the same process (start time) and is not a zombie."""
        stat = procfs.read_stat(ident.pid)
        if stat is not None and stat.start_time != ident.start_time:
            return False  # the pid now belongs to another process: not our group
        if stat is None or stat.zombie:
            if ident.pid in self._children or ident.pid in self._dying:
                self._reap_group(ident.pid)
            return False
        return True

    def returncode(self, ident: ProcessIdentity) -> int | None:
        """How the machine's leader ended, if it was reaped here (None: not seen), once."""
        return self._returncodes.pop(ident.pid, None)

    def signal(self, ident: ProcessIdentity, sig: int) -> bool:
        """Send ``sig`` to the machine (its whole process group, minus a sandbox
        wrapper for signals other than SIGSTOP/SIGCONT). False if it is gone."""
        if not self._owns_group(ident):
            return False
        if sig in (signals.SIGSTOP, signals.SIGCONT) or not _is_wrapper(ident.pid):
            return self._signal_group(ident, sig)
        members = procfs.group_members(ident.pid)
        inner = [m.pid for m in members if m.pid != ident.pid and not m.zombie]
        delivered = [pid for pid in inner if _kill(pid, sig)]
        return bool(delivered) or self._signal_group(ident, sig)

    def suspend(self, ident: ProcessIdentity) -> bool:
        """Freeze every process of the machine (SIGSTOP cannot be caught or ignored)."""
        return self.signal(ident, signals.SIGSTOP)

    async def wait_stopped(self, ident: ProcessIdentity,
                           timeout_s: float = SUSPEND_WAIT_S) -> bool:
        """Until every live process of the machine is stopped, at most `timeout_s`: a
        SIGSTOP takes effect when the process next runs, on a loaded host not at once,
        and "suspended" must mean it no longer runs."""
        deadline = time.monotonic() + timeout_s
        while True:
            members = [m for m in procfs.group_members(ident.pid) if not m.zombie]
            if all(m.state in ("T", "t") for m in members):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.002)

    def resume(self, ident: ProcessIdentity) -> bool:
        return self.signal(ident, signals.SIGCONT)

    async def stop(self, ident: ProcessIdentity, kill_signal: int, kill_timeout_s: float) -> None:
        """SIGCONT, then ``kill_signal``; after ``kill_timeout_s`` seconds SIGKILL.
        Returns only when no process of the group is left (zombies reaped where
        they are ours)."""
        self.signal(ident, signals.SIGCONT)
        self.signal(ident, kill_signal)
        if await self._wait_group_gone(ident, kill_timeout_s):
            return
        self.signal(ident, signals.SIGKILL)
        while not await self._wait_group_gone(ident, _KILL_RETRY_S):
            # Something survived (a stuck wrapper, or a fork racing the signal): all of it.
            self._signal_group(ident, signals.SIGKILL)

    async def wait_ready(
        self,
        ident: ProcessIdentity,
        host: str,
        port: int,
        health_path: str | None,
        timeout_s: float,
        *,
        h2c: bool = False,
    ) -> ReadyResult:
        """Poll the machine until it answers, exits or `timeout_s` passes (agent/ready.py)."""
        return await wait_ready(lambda: self.alive(ident), host, port, health_path, timeout_s,
                                h2c=h2c)

    def own_sessions(self, machines_dir: Path) -> list[tuple[str, ProcessIdentity]]:
        """(machine id, session) of every live machine session launched for a machine dir
        under ``machines_dir`` — by the dir in its environment, or its stdout going to a
        log there (machines launched before the dir was in the environment) — whatever
        the op log says: recovery keeps those it records and kills the others."""
        return [(mid, ident) for mid, ident, stat in _launched_under(machines_dir)
                if stat.pid == stat.session]

    def processes_of(self, machines_dir: Path, machine_id: str) -> list[ProcessIdentity]:
        """Every live process launched for the machine, in any group or session (a
        setsid child, a double-forked daemon): all strays once its own group is gone."""
        return [ident for mid, ident, _ in _launched_under(machines_dir)
                if mid == machine_id]

    async def kill_all(self, idents: list[ProcessIdentity]) -> None:
        """SIGKILL each process (if it is still that process) and wait until all are
        gone, reaping those that came back to us as orphans."""
        for ident in idents:
            if self._owns_group(ident):
                _kill(ident.pid, signals.SIGKILL)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _KILL_RETRY_S
        pending = list(idents)
        while pending and loop.time() < deadline:
            await asyncio.sleep(FIRST_POLL_S)
            pending = [i for i in pending if self.alive(i) or not self._reap(i.pid)]

    def group_pids(self, ident: ProcessIdentity) -> list[int]:
        """Live (non-zombie) pids in the machine's process group."""
        if not self._owns_group(ident):
            return []
        return [m.pid for m in procfs.group_members(ident.pid) if not m.zombie]

    def _spawn(self, argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> ProcessIdentity:
        return self._record(_popen(argv, cwd, env, log))

    def _record(self, proc: subprocess.Popen[bytes]) -> ProcessIdentity:
        self._children[proc.pid] = proc
        stat = procfs.read_stat(proc.pid)  # our unreaped child: its /proc entry exists
        if stat is None:
            raise RuntimeError(f"launched pid {proc.pid} vanished from /proc")
        return ProcessIdentity(proc.pid, stat.start_time)

    def _probe_sandbox(self) -> bool:
        """Run ``true`` in a sandbox shaped like a machine's: does this host allow it?
        Run as a machine would be (own session, we are subreaper) so that its
        namespace init is reaped here too."""
        if self._bwrap is None:
            return False
        become_child_subreaper()
        argv = [*sandbox_argv(self._bwrap, Path("/"), "", "probe", 0, 0), "true"]
        env = {"PATH": DEFAULT_PATH}
        try:
            ident = self._spawn(argv, Path("/"), env, Path(os.devnull))
        except OSError:
            return False
        proc = self._children[ident.pid]
        deadline = time.monotonic() + _SANDBOX_PROBE_S
        while self._reap_group(ident.pid) and time.monotonic() < deadline:
            time.sleep(0.002)
        if proc.poll() is None:  # hung: give up on the sandbox
            self._signal_group(ident, signals.SIGKILL)
            return False
        return proc.returncode == 0

    def _owns_group(self, ident: ProcessIdentity) -> bool:
        # A pgid cannot be reused while any member is alive, so if the leader is
        # gone the group (if any) is still this machine's; if a process with a
        # different start time holds the pid, the machine's group is empty.
        stat = procfs.read_stat(ident.pid)
        return stat is None or stat.start_time == ident.start_time

    def _signal_group(self, ident: ProcessIdentity, sig: int) -> bool:
        try:
            os.killpg(ident.pid, sig)
        except ProcessLookupError:
            return False
        leader = procfs.read_stat(ident.pid)
        if leader is not None and not leader.zombie and leader.start_time == ident.start_time:
            return True  # the leader lives, so the group does: no scan of all of /proc
        return bool(self.group_pids(ident))

    async def _wait_group_gone(self, ident: ProcessIdentity, timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        interval = FIRST_POLL_S
        while True:
            if not self._owns_group(ident) or not self._reap_group(ident.pid):
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(interval)
            interval = min(interval * BACKOFF, MAX_POLL_S)

    def _reap_group(self, pgid: int) -> bool:
        """Reap zombies of group ``pgid`` that are our children: the launched
        leader, and (as child subreaper) bwrap's namespace init, which bwrap's
        monitor exits without waiting for. True while some member still runs
        or is a zombie that its parent in the group (or we) will reap later."""
        me = os.getpid()
        members = procfs.group_members(pgid)
        in_group = {member.pid for member in members}
        pending = False
        for member in members:
            if member.zombie and member.ppid == me:
                pending = not self._reap(member.pid) or pending
            elif not member.zombie or member.ppid in in_group:
                pending = True
        if pending:
            self._dying.add(pgid)
        else:
            self._dying.discard(pgid)
        return pending

    def _reap(self, pid: int) -> bool:
        """Reap our zombie child ``pid``; False if it cannot be reaped yet (a
        thread-group leader shows as a zombie before its other threads are gone)."""
        proc = self._children.pop(pid, None)
        if proc is not None:
            if proc.poll() is None:
                self._children[pid] = proc
                return False
            self._returncodes[pid] = proc.returncode
            return True
        try:
            reaped, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True  # not (or no longer) ours to reap
        return reaped == pid

    def _reap_finished_children(self) -> None:
        for pid, proc in list(self._children.items()):
            if proc.poll() is not None:
                del self._children[pid]
                self._returncodes[pid] = proc.returncode
        for pgid in list(self._dying):
            self._reap_group(pgid)


def _popen(argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """The machine's process, in a session of its own, output to `log` (safe in a thread:
    it touches no state of the driver)."""
    # Read-write: on a FIFO (agent.outputs) a write then never meets a missing reader.
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
    log_fd = open_private(log, flags)
    try:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,
        )
    finally:
        os.close(log_fd)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signals.SIGKILL)
    except ProcessLookupError:
        pass


def machine_env(spec: ProcessLaunch) -> dict[str, str]:
    """The process environment: the spec's, plus the machine id and a PATH."""
    env = dict(spec.env)
    env.setdefault("PATH", DEFAULT_PATH)
    env[MACHINE_ID_ENV] = spec.machine_id
    env[MACHINE_DIR_ENV] = str(spec.log_path.parent)
    return env


def allocate_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _launched_under(machines_dir: Path) -> list[tuple[str, ProcessIdentity, procfs.ProcStat]]:
    """(machine id, identity, stat) of every live process launched for a machine dir under
    ``machines_dir`` (its environment names the dir, or its stdout goes to a log there)."""
    prefix = str(machines_dir) + os.sep
    found = []
    for stat in procfs.stats():
        if stat.zombie:
            continue
        machine_id = procfs.environ_value(stat.pid, MACHINE_ID_ENV)
        if not machine_id:
            continue
        where = (procfs.environ_value(stat.pid, MACHINE_DIR_ENV)
                 or procfs.fd_target(stat.pid, 1) or "")
        if (where + os.sep).startswith(prefix):
            found.append((machine_id, ProcessIdentity(stat.pid, stat.start_time), stat))
    return found


def _is_wrapper(pid: int) -> bool:
    return procfs.exe_name(pid) == WRAPPER_EXE


def _kill(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True
