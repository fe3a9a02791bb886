"""The agent's port to whatever runs machines: a Driver.

The agent decides *what* a machine is (its state, its op log) and asks a Driver to make
it so: prepare (everything but the app's process, for spares and stopped machines),
launch, signal, suspend/resume, stop, say whether it still runs and why it ended, and
clean up. What a Driver returns is recorded in the op log as driver-neutral facts
(`Running`: a runtime id, the pid and its start time, the address the edge dials), so
any driver re-adopts its machines after the agent restarts. Drivers: `agent.ocidriver`
(an OCI runtime: a real container; the default as root) and `agent.driver` (a process
in a bubblewrap sandbox, or a plain process: no boundary between tenants).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.ready import ReadyResult


@dataclass(frozen=True)
class LaunchSpec:
    machine_id: str
    app: str
    argv: list[str]  # entrypoint + cmd; argv[0] may be a bare name resolved via env PATH
    env: dict[str, str]  # the app's environment (image Env, app env, PORT, THAW_*)
    rootfs: Path  # the image's unpacked tree: read-only, shared by every machine of it
    workdir: str  # absolute path inside the image ("" = /)
    user: str  # the image's User ("" = root)
    port: int  # the port the app listens on inside the machine
    cpus: float
    memory_mb: int
    machine_dir: Path  # the agent's dir of this machine (its log, its driver's files)

    @property
    def output(self) -> Path:
        """The FIFO the app's stdout and stderr go to (agent.outputs stamps and keeps it)."""
        return self.machine_dir / "output"


@dataclass(frozen=True)
class Running:
    """A launched machine as the op log records it."""

    runtime_id: str  # the runtime's name for it ("" for a plain process)
    pid: int  # the process the driver watches (a container's init)
    start_time: int  # field 22 of /proc/<pid>/stat: guards against pid reuse
    host: str  # where the edge dials it
    port: int


class Driver(Protocol):
    name: str  # "oci/runc", "bubblewrap", "process"
    isolated: bool  # a boundary between tenants (own userland, namespaces, limits)

    async def prepare(self, spec: LaunchSpec) -> None:
        """Everything but the app's process, so a later launch is quick (idempotent)."""

    async def launch(self, spec: LaunchSpec) -> Running:
        """Start the app (preparing first if needed); OSError with a reason if it cannot."""

    def alive(self, run: Running) -> bool:
        """The machine's process still runs (reaps it if it is our zombie)."""

    def exit_reason(self, run: Running) -> str:
        """Why it ended, once not alive: exited(N), signalled(SIG), oom, or exited(?)."""

    def signal(self, run: Running, sig: int) -> bool:
        """Send `sig` to the app; False if it is gone."""

    async def suspend(self, run: Running) -> bool:
        """Freeze every process of the machine; False if it is gone."""

    async def resume(self, run: Running) -> bool:
        """Thaw it; False if it is gone."""

    async def stop(self, run: Running, kill_signal: int, kill_timeout_s: float) -> None:
        """`kill_signal`, then SIGKILL after `kill_timeout_s`; returns once all is gone."""

    async def exited(self, machine_id: str, machine_dir: Path) -> None:
        """Its process is gone: let go of what only a run holds (the runtime's container,
        its cgroup); keep its rootfs and network for the next start."""

    async def destroy(self, machine_id: str, machine_dir: Path) -> None:
        """Remove everything the machine had on this host (idempotent)."""

    async def wait_ready(self, run: Running, health_path: str | None,
                         timeout_s: float, *, h2c: bool = False) -> ReadyResult:
        """Poll until it answers on its port (or health path, over HTTP/2 with `h2c`),
        exits, or time runs out."""

    async def adopt(self, machines_dir: Path, recorded: dict[str, Running | None]) -> None:
        """At agent start: end every machine run of this agent's that the op log does not
        record (`recorded`: machine id -> its recorded run, or None when none)."""

    async def end_strays(self, machines_dir: Path, machine_id: str) -> None:
        """Kill processes of the machine that outlived it (none inside a pid namespace)."""

    async def release_all(self, machines_dir: Path) -> None:
        """The agent stops with its machines: let go of every mount and namespace (what a
        machine keeps across a stop, like its writes, stays)."""
