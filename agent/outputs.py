"""A machine's output, stamped, bounded and paced: the app writes its stdout and stderr
into a FIFO in its directory; the agent reads it and appends each line to the machine's
`log`, prefixed with the time it arrived (RFC 3339, UTC, milliseconds).

The machine holds the FIFO open for reading and writing, so a write never fails when the
agent is away (restarting): it waits in the pipe (up to the pipe's size, raised to 1 MiB
where allowed; past that the app's writes block until an agent reads again, as Docker's
do when its daemon is down with live-restore). The agent holds it open for writing too,
so its read end never sees an end of file between two runs of the machine. A line longer
than MAX_LINE_BYTES, or a partial line left waiting PARTIAL_FLUSH_S, is stored as it is.

What one machine may cost the host is bounded here, not by its cgroup: the log is cut
back to half of `max_bytes` as soon as it passes it (copy-truncate), and the agent reads
at most `rate_bytes_s` a second of it (a token bucket): a machine that writes faster
fills its pipe and its writes wait (it is slowed, the agent's CPU and disk are not).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from agent.machinelog import trim_log
from ground.statefiles import FILE_MODE

log = logging.getLogger("thaw.agent")

FIFO_NAME = "output"
MAX_LINE_BYTES = 16384
PARTIAL_FLUSH_S = 0.25
READ_BYTES = 65536
_F_SETPIPE_SZ = 1031
PIPE_BYTES = 1 << 20
DEFAULT_MAX_BYTES = 1 << 20  # a machine's log, cut back to half past this
DEFAULT_RATE_BYTES_S = float(1 << 20)  # a machine's output the agent takes in, per second


def ensure_fifo(machine_dir: Path) -> Path:
    """The machine's output FIFO (made if missing; a file of that name is replaced)."""
    path = machine_dir / FIFO_NAME
    try:
        if stat.S_ISFIFO(os.lstat(path).st_mode):
            return path
        path.unlink()
    except FileNotFoundError:
        pass
    os.mkfifo(path, 0o600)
    return path


def writer_fd(fifo: Path) -> int:
    """An fd for the machine's stdout and stderr: read-write, so a write never meets a
    FIFO without a reader (EPIPE, SIGPIPE) while the agent restarts."""
    fd = os.open(ensure_fifo(fifo.parent), os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass  # above /proc/sys/fs/pipe-max-size: the default size
    return fd


class OutputPump:
    """Moves one machine's output from its FIFO to its log, stamping each line."""

    def __init__(self, machine_dir: Path, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 rate_bytes_s: float = DEFAULT_RATE_BYTES_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.fifo = ensure_fifo(machine_dir)
        self.log_path = machine_dir / "log"
        self.max_bytes = max_bytes
        self.rate_bytes_s = rate_bytes_s
        self._clock = clock
        self._read_fd = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._hold_fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._partial = b""
        self._flush: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()
        self._tokens = float(READ_BYTES)  # the bucket holds one read
        self._filled_at = self._loop.time()
        self._paused: asyncio.TimerHandle | None = None
        self._loop.add_reader(self._read_fd, self._readable)

    def _readable(self) -> None:
        now = self._loop.time()
        self._tokens = min(float(READ_BYTES),
                           self._tokens + (now - self._filled_at) * self.rate_bytes_s)
        self._filled_at = now
        if self._tokens < 1:  # over its rate: stop reading; its writes wait in the pipe
            self._loop.remove_reader(self._read_fd)
            self._paused = self._loop.call_later((1 - self._tokens) / self.rate_bytes_s,
                                                 self._resume)
            return
        try:
            data = os.read(self._read_fd, int(self._tokens))
        except BlockingIOError:
            return
        except OSError as exc:
            log.warning("machine output %s: %s", self.fifo, exc)
            return
        self._tokens -= len(data)
        self._take(data)

    def _resume(self) -> None:
        self._paused = None
        self._loop.add_reader(self._read_fd, self._readable)

    def _take(self, data: bytes) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        data = self._partial + data
        cut = data.rfind(b"\n") + 1
        lines, rest = data[:cut], data[cut:]
        while len(rest) > MAX_LINE_BYTES:
            lines += rest[:MAX_LINE_BYTES] + b"\n"
            rest = rest[MAX_LINE_BYTES:]
        self._partial = rest
        if lines:
            self._append(lines)
        if rest:
            self._flush = self._loop.call_later(PARTIAL_FLUSH_S, self._flush_partial)

    def _flush_partial(self) -> None:
        self._flush = None
        if self._partial:
            partial, self._partial = self._partial, b""
            self._append(partial + b"\n")

    def _append(self, lines: bytes) -> None:
        stamp = stamp_of(self._clock())
        stamped = b"".join(stamp + line + b"\n" for line in lines.split(b"\n")[:-1])
        try:
            fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                         FILE_MODE)
            try:
                os.write(fd, stamped)
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
            if size > self.max_bytes:
                trim_log(self.log_path, self.max_bytes, self.max_bytes // 2)
        except OSError as exc:  # a full disk: the output is lost, the machine is not held
            log.warning("machine log %s: %s", self.log_path, exc)

    def close(self) -> None:
        for timer in (self._flush, self._paused):
            if timer is not None:
                timer.cancel()
        self._flush_partial()
        self._loop.remove_reader(self._read_fd)
        os.close(self._read_fd)
        os.close(self._hold_fd)


def stamp_of(at: float) -> bytes:
    """"2026-11-27T12:00:00.123Z " for `at` (seconds since the epoch)."""
    seconds = int(at)
    millis = int((at - seconds) * 1000)
    return (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
            + f".{millis:03d}Z ").encode()


class Outputs:
    """The pumps of one agent's machines."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES,
                 rate_bytes_s: float = DEFAULT_RATE_BYTES_S) -> None:
        self._pumps: dict[str, OutputPump] = {}
        self.max_bytes = max_bytes
        self.rate_bytes_s = rate_bytes_s

    def ensure(self, machine_id: str, machine_dir: Path) -> Path:
        """The machine's FIFO, its pump running; returns the FIFO's path."""
        pump = self._pumps.get(machine_id)
        if pump is None:
            pump = self._pumps[machine_id] = OutputPump(
                machine_dir, max_bytes=self.max_bytes, rate_bytes_s=self.rate_bytes_s)
        return pump.fifo

    def close(self, machine_id: str) -> None:
        pump = self._pumps.pop(machine_id, None)
        if pump is not None:
            pump.close()

    def close_all(self) -> None:
        for machine_id in list(self._pumps):
            self.close(machine_id)
