"""The OCI runtime's command line (runc's, which crun and runsc share): create, start,
pause, resume, kill, delete, state, list. Every call is bounded in time; a failure is a
RuntimeFailure carrying the runtime's own last error line, never a traceback."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ground import spawn

CALL_TIMEOUT_S = 30.0
DEFAULT_RUNTIME = "runc"


class RuntimeFailure(OSError):
    pass


@dataclass(frozen=True)
class ContainerState:
    id: str
    status: str  # creating | created | running | paused | stopped
    pid: int
    bundle: str


class Runtime:
    """One runtime binary with its own state root (one per agent)."""

    def __init__(self, binary: str, root: Path) -> None:
        path = shutil.which(binary)
        if path is None:
            raise RuntimeFailure(f"OCI runtime {binary!r} not found")
        self.binary = path
        self.name = Path(path).name
        self.root = root

    async def create(self, container_id: str, bundle: Path, output_fd: int) -> int:
        """Create the container (its init waits for `start`); its stdout and stderr are
        `output_fd`, its stdin /dev/null. Returns its init's pid (from the pid file the
        runtime writes: no `state` call)."""
        pid_file = bundle / "init.pid"
        pid_file.unlink(missing_ok=True)
        await self._run("create", "--bundle", str(bundle), "--pid-file", str(pid_file),
                        container_id, output_fd=output_fd, log=bundle / "runtime.log")
        try:
            return int(pid_file.read_text().strip())
        except (OSError, ValueError):
            raise RuntimeFailure(f"{self.name} create: no pid in {pid_file}") from None

    async def start(self, container_id: str) -> None:
        await self._run("start", container_id)

    async def pause(self, container_id: str) -> None:
        await self._run("pause", container_id)

    async def resume(self, container_id: str) -> None:
        await self._run("resume", container_id)

    async def kill(self, container_id: str, signal: str, all_processes: bool = False) -> None:
        await self._run("kill", *(["--all"] if all_processes else []), container_id, signal)

    async def delete(self, container_id: str, force: bool = False) -> None:
        """Delete the container's state and cgroup; one that does not exist is fine."""
        if await self.state(container_id) is None:
            return
        await self._run("delete", *(["--force"] if force else []), container_id)

    async def state(self, container_id: str) -> ContainerState | None:
        """The container's state, or None if the runtime does not know it."""
        if not (self.root / container_id).exists():
            return None
        try:
            out = await self._run("state", container_id)
        except RuntimeFailure:
            if not (self.root / container_id).exists():
                return None
            raise
        return _state(json.loads(out))

    async def list(self) -> list[ContainerState]:
        out = await self._run("list", "--format", "json")
        return [_state(doc) for doc in json.loads(out or b"null") or []]

    async def _run(self, *args: str, output_fd: int | None = None,
                   log: Path | None = None) -> bytes:
        argv = [self.binary, "--root", str(self.root)]
        if log is not None:
            argv += ["--log", str(log), "--log-format", "json"]
        try:
            done = await spawn.run([*argv, *args], timeout_s=CALL_TIMEOUT_S,
                                   output_fd=output_fd)
        except TimeoutError:
            raise RuntimeFailure(f"{self.name} {args[0]}: no answer in {CALL_TIMEOUT_S:g} s") \
                from None
        out, err = done.out, done.err
        if done.returncode != 0:
            detail = (err or b"").decode(errors="replace").strip()
            if log is not None:
                detail = last_error(log) or detail
            raise RuntimeFailure(f"{self.name} {args[0]}: {detail[-500:] or 'failed'}")
        return out or b""


def last_error(log: Path) -> str:
    """The runtime's last error message in its JSON log ("" if none)."""
    try:
        lines = log.read_bytes()[-16384:].splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        try:
            entry: Any = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("level") in ("error", "fatal"):
            return str(entry.get("msg", ""))
    return ""


def _state(doc: dict[str, Any]) -> ContainerState:
    return ContainerState(id=str(doc["id"]), status=str(doc["status"]),
                          pid=int(doc.get("pid") or 0), bundle=str(doc.get("bundle", "")))
