"""The access log's writer: lines in batches, written off the event loop.

`record` turns an exchange that ended into a line (edge/core/accesslog.py says
which are logged and what they say) and keeps it in memory, not yet encoded. The
kept lines are encoded together and go out in one write every `flush_every_s`, or
as soon as about `batch_bytes` are waiting, from a thread of their own, so a slow
disk or a stdout nobody reads never stops the loop; while a write is under way new
lines wait for the next one. Memory is bounded: past about `max_pending_bytes`
waiting (a line counted as its fixed part and the lengths of the texts a client
chose: path, host, request id), lines are dropped and counted (`dropped`, exported
as thaw_edge_access_log_dropped_lines_total).

The target is stdout ("stdout" or "-") or a file, opened in append mode and
opened again when the path stops naming it (moved away by logrotate), so
rotation needs no signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from edge.adapters.h2stream import H2Stream
from edge.core.accessline import Line
from edge.core.accesslog import CLIENT_GONE, encode, line, logged, path_of
from edge.core.bucket import TokenBucket
from edge.exchange import Exchange
from ground.statefiles import FILE_MODE

log = logging.getLogger("thaw.edge")

STDOUT = ("stdout", "-")
FLUSH_EVERY_S = 0.5
BATCH_BYTES = 128 * 1024  # counted as a line's size is (more than it takes): ~100 KB
MAX_PENDING_BYTES = 8 * 1024 * 1024
LINE_BYTES = 400  # a line kept, without the path, host and request id a client sent


class LogFile:
    """Where the lines go (called from the writer thread only)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.fd = -1
        self.inode: tuple[int, int] | None = None

    def write(self, data: bytes) -> None:
        fd = 1 if self.target in STDOUT else self._open()
        done = os.write(fd, data)
        while done < len(data):  # (a pipe may take part of it)
            done += os.write(fd, data[done:])

    def _open(self) -> int:
        try:
            st = os.stat(self.target)
            current: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            current = None
        if self.fd < 0 or current != self.inode:
            self.close()
            self.fd = os.open(self.target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
            st = os.fstat(self.fd)
            self.inode = (st.st_dev, st.st_ino)
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


GONE_LINES_PER_S = 10.0  # 499 lines a second (bursts of twice that); the rest counted

class AccessLog:
    def __init__(self, target: str, sample_rate: float, loop: asyncio.AbstractEventLoop, *,
                 flush_every_s: float = FLUSH_EVERY_S, batch_bytes: int = BATCH_BYTES,
                 max_pending_bytes: int = MAX_PENDING_BYTES,
                 draw: Callable[[], float] = random.random,
                 wall: Callable[[], float] = time.time) -> None:
        self.sample_rate = sample_rate
        self.loop = loop
        self.flush_every_s = flush_every_s
        self.batch_bytes = batch_bytes
        self.max_pending_bytes = max_pending_bytes
        self._draw = draw
        self._wall = wall
        self._file = LogFile(target)
        self._lines: list[Line] = []
        self._bytes = 0  # the lines kept, about
        self._timer: asyncio.TimerHandle | None = None
        self._writing: asyncio.Future[None] | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="thaw-access-log")
        self._closed = False
        self.written = 0  # lines
        self.dropped = 0  # lines
        # requests whose client went away (499) are logged up to GONE_LINES_PER_S: a
        # flood of reset streams must not become a flood of lines; the rest are counted
        self._gone = TokenBucket(GONE_LINES_PER_S, loop.time())
        self.gone_unlogged = 0
        self._peer = b""  # the last line's client address, and as text
        self._client = ""

    def record(self, exchange: Exchange, answered: bool, seconds: float) -> None:
        """An exchange ended (`answered`, or its client went away first) after `seconds`."""
        status = exchange.status if answered else CLIENT_GONE
        cold = exchange.held_at > 0.0
        if not answered and not self._gone.take(self.loop.time()):
            self.gone_unlogged += 1
            return
        if logged(status, cold, self.sample_rate, self._draw):
            peer = exchange.client.peer
            if peer is not self._peer:  # (a keep-alive connection's answers: one decode)
                self._peer, self._client = peer, peer.decode("latin-1")
            head = exchange.head  # (what a client chose, counted from the head's own fields)
            self.write(line_of(exchange, status, cold, seconds, self._wall(), self.loop,
                               self._client),
                       LINE_BYTES + len(head.target) + len(head.host)
                       + len(head.request_id or b""))

    def write(self, line: Line, size: int) -> None:
        """Keep `line`, counted as `size` bytes against the memory bound."""
        if self._closed:  # (an exchange cut after the edge stopped)
            return
        if self._bytes + size > self.max_pending_bytes:
            self.dropped += 1
            return
        self._lines.append(line)
        self._bytes += size
        if self._bytes >= self.batch_bytes:
            self.flush()
        elif self._timer is None:
            self._timer = self.loop.call_later(self.flush_every_s, self.flush)

    def flush(self) -> None:
        """Hand what is waiting to the writer thread (unless a write is under way: its end
        flushes again)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._writing is not None or not self._lines:
            return
        lines, count = self._lines, len(self._lines)
        self._lines, self._bytes = [], 0
        try:
            data = encode(lines)
        except Exception as exc:  # (no field can fail today: a bug must not wedge the log)
            log.warning("access log: %d lines could not be encoded: %r", count, exc)
            self.dropped += count
            return
        self._writing = self.loop.run_in_executor(self._executor, self._file.write, data)
        self._writing.add_done_callback(partial(self._written, count))

    def _written(self, count: int, done: asyncio.Future[None]) -> None:
        self._writing = None
        error = None if done.cancelled() else done.exception()
        if error is not None:
            if not self.dropped:
                log.warning("access log: cannot write: %s", error)
            self.dropped += count
        else:
            self.written += count
        if self._bytes >= self.batch_bytes:
            self.flush()
        elif self._lines and self._timer is None:
            self._timer = self.loop.call_later(self.flush_every_s, self.flush)

    async def drain(self) -> None:
        """Return once every line kept so far is written (or dropped)."""
        while self._writing is not None or self._lines:
            if self._writing is None:
                self.flush()
            writing = self._writing
            if writing is not None:
                with contextlib.suppress(Exception):
                    await writing  # (its done callback, `_written`, has run by now)

    async def close(self) -> None:
        """Write what is left, then close the file; later lines are ignored."""
        await self.drain()
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._executor.shutdown(wait=True)
        self._file.close()


def line_of(exchange: Exchange, status: int, cold: bool, seconds: float, wall: float,
            loop: asyncio.AbstractEventLoop, client: str) -> Line:
    """The line of an exchange that ended with `status` after `seconds` (`wall`: now, s
    since the epoch; `loop`: for a request that ended while still held; `client`: its
    client's address as text)."""
    slot = exchange.slot
    app = exchange.app
    head = exchange.head
    phases = None
    if cold:
        wake = exchange.wake
        # hold_s is set on release; a request that ended held (504, gone) was held till now
        hold_s = exchange.hold_s or max(0.0, loop.time() - exchange.held_at)
        phases = ((hold_s, wake.place_ms, wake.pull_ms, wake.boot_ms) if wake is not None
                  else (hold_s, 0.0, 0.0, 0.0))
    if isinstance(exchange.client, H2Stream):
        proto = "h2"
    else:
        proto = "http/1.0" if exchange.http10 else "http/1.1"
    return line(
        ts=wall, request_id=(exchange.request_id or head.request_id or b"").decode("latin-1"),
        app=app.name if app is not None else "",
        machine=slot.id if slot is not None else "",
        worker=slot.worker if slot is not None else "",
        method=exchange.method.decode("latin-1"), host=head.host, path=path_of(head.target),
        proto=proto, status=status, code=exchange.code, bytes_in=exchange.received,
        bytes_out=exchange.sent, duration_s=seconds,
        client=client, cold=phases,
    )
