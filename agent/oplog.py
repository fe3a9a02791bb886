"""The op log on disk: append, make durable, replay on start, compact, repair.

Framing and checksums live in `agent.core.oplog_codec`; this module does the
file IO. `append` writes its records as one write at once (so the in-memory
state may follow at once, and records appended together are kept or lost
together); `durable()` returns when everything appended so far is on disk.
Appends made while an fsync runs share the next one (group commit), and the
fsync runs off the event loop; compaction writes and fsyncs on the loop (it is
rare, and appends must wait for it anyway). A write that fails or is short (a
full disk, an I/O error) is cut back to the last whole frame before anything
else is appended, so the log stays bootable; a log that cannot be cut back or
fsynced is `broken` and takes nothing more. At open a torn or zero-filled tail
is cut off (its bytes kept in `oplog.tail-<time>` unless all zero), a format-1
log is kept as `oplog.format1-<time>` and rewritten in format 2, and damage
before the end stops the agent (`CorruptLog`) unless it is repaired: a copy of
the damaged log is kept and the valid records rewritten.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from agent.core import oplog_codec
from agent.core.oplog_codec import CorruptLog
from agent.core.records import Record
from ground.durable import fsync_dir
from ground.statefiles import open_private, private_dir

log = logging.getLogger("thaw.agent.oplog")

Write = Callable[[int, bytes], int]


class LogWriteFailed(Exception):
    """An append could not be written whole; the log is as it was before it."""

    def __init__(self, reason: str, full: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.full = full  # no space left (as opposed to an I/O error)


class LogSyncFailed(Exception):
    """fsync failed: what was appended may or may not be on disk; nothing more is."""


class RepairFailed(Exception):
    """A repair or migration could not write its copy or the new log (no space?); the
    log on disk is as it was."""


class OpLog:
    """Append-only, one writer. `write` and `fsync` are os.write and os.fsync (tests
    stand in a full disk for them)."""

    def __init__(self, path: Path, *, write: Write = os.write,
                 fsync: Callable[[int], None] = os.fsync) -> None:
        self.path = path
        self._write = write
        self._fsync = fsync
        self._fd: int | None = None
        self.size = 0  # bytes of whole frames (and the magic) in the file
        self.appended = 0  # records appended since the process started
        self.synced = 0  # how many of them are known durable
        self.appended_since_compaction = 0
        self.dropped_torn_tail = False
        self.migrated = False  # the log read was format 1 (kept, and rewritten in format 2)
        self.broken = ""  # why nothing can be made durable any more ("" while fine)
        self._flush: asyncio.Future[None] | None = None

    # -- open, repair --------------------------------------------------------------------

    def open(self) -> list[Record]:
        """Read every valid record, cut a torn tail, migrate format 1, open for appending.
        Raises CorruptLog when the log is damaged before its end."""
        private_dir(self.path.parent)
        data = self.path.read_bytes() if self.path.exists() else b""
        decoded = oplog_codec.decode(data)
        if decoded.version == 1:
            self._keep_copy("format1", data)
            self._rewrite(decoded.records)
            self.migrated = True
            log.warning("op log: rewrote a format-1 log in format 2 (%d records); the old "
                        "file is kept next to it", len(decoded.records))
            data = self.path.read_bytes()
            decoded = oplog_codec.decode(data)
        if decoded.torn and any(data[decoded.valid_bytes:]):
            self._keep_copy("tail", data[decoded.valid_bytes:])
        self._fd = open_private(self.path, os.O_WRONLY | os.O_APPEND)  # (an old one tightened)
        try:
            if decoded.torn:
                os.ftruncate(self._fd, decoded.valid_bytes)
                self.dropped_torn_tail = True
            self.size = decoded.valid_bytes
            if self.size == 0:
                os.write(self._fd, oplog_codec.MAGIC)
                self.size = len(oplog_codec.MAGIC)
            os.fsync(self._fd)
            fsync_dir(self.path.parent)
        except BaseException:
            self.close()
            raise
        self.appended_since_compaction = len(decoded.records)
        return decoded.records

    def repair(self, damage: CorruptLog) -> list[Record]:
        """Keep a copy of the damaged log, rewrite the valid records, open it; returns the
        records kept. What was dropped is said in the log. RepairFailed without room."""
        data = self.path.read_bytes()
        kept = self._keep_copy("damaged", data)
        self._rewrite(damage.records)
        log.warning("op log repaired: kept %d records, dropped %d bytes from byte %d (%s); "
                    "the damaged log is kept as %s", len(damage.records),
                    len(data) - damage.offset, damage.offset, damage.reason, kept)
        return self.open()

    def _keep_copy(self, what: str, data: bytes) -> Path:
        """`data` saved durably next to the log as oplog.<what>-<time>."""
        copy = self.path.with_name(f"{self.path.name}.{what}-{time.time_ns()}")
        try:
            with os.fdopen(open_private(copy), "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            fsync_dir(self.path.parent)
        except OSError as exc:
            copy.unlink(missing_ok=True)
            raise RepairFailed(f"cannot keep a copy of the op log ({what}) as {copy}: "
                               f"{os.strerror(exc.errno or errno.EIO)}") from None
        return copy

    # -- append, durable ----------------------------------------------------------------

    def append(self, *records: Record) -> None:
        """Write the records' frames in one write (not yet durable: await `durable()`
        before acting on them). RecordTooLarge writes nothing."""
        if self.broken:
            raise LogWriteFailed(self.broken, full=False)
        if self._fd is None:
            raise RuntimeError("op log is not open")
        frames = b"".join(oplog_codec.encode(record) for record in records)
        try:
            written = self._write(self._fd, frames)
        except OSError as exc:
            self._cut_back()
            raise LogWriteFailed(os.strerror(exc.errno or errno.EIO),
                                 full=exc.errno in (errno.ENOSPC, errno.EDQUOT)) from None
        if written != len(frames):
            self._cut_back()
            raise LogWriteFailed(f"short write ({written} of {len(frames)} bytes)", full=True)
        self.size += len(frames)
        self.appended += len(records)
        self.appended_since_compaction += len(records)

    def _cut_back(self) -> None:
        """Drop a partial frame: the next append must follow a whole one."""
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, self.size)
        except OSError as exc:
            self._broke(f"cannot cut a partial frame back: {os.strerror(exc.errno or 0)}")

    def sync(self) -> None:
        """fsync now, on the calling thread (at boot, before the loop serves anything)."""
        assert self._fd is not None
        try:
            self._fsync(self._fd)
        except OSError as exc:
            self._broke(f"fsync failed: {os.strerror(exc.errno or errno.EIO)}")
            raise LogSyncFailed(self.broken) from None
        self.synced = self.appended

    def _broke(self, why: str) -> None:
        self.broken = why
        log.error("op log: %s; the agent takes no more changes", why)

    async def durable(self) -> None:
        """Return once every record appended so far is on disk. Appends made while an
        fsync runs wait for the next one, which covers them all."""
        target = self.appended
        while self.synced < target:
            if self.broken:
                raise LogSyncFailed(self.broken)
            if self._flush is None:
                self._flush = asyncio.ensure_future(self._sync(self.appended))
            await asyncio.shield(self._flush)

    async def _sync(self, upto: int) -> None:
        fd = self._fd
        assert fd is not None
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._fsync, fd)
        except OSError as exc:
            self._broke(f"fsync failed: {os.strerror(exc.errno or errno.EIO)}")
            raise LogSyncFailed(self.broken) from None
        finally:
            self._flush = None
        self.synced = max(self.synced, upto)

    # -- compaction ---------------------------------------------------------------------

    def compact(self, records: list[Record]) -> bool:
        """Replace the log by `records` atomically (everything in them is durable after).
        Not while an fsync of the current file runs: False, try again later."""
        if self._flush is not None or self.broken:
            return False
        tmp = self.path.with_name(self.path.name + ".compact")
        try:
            self._write_file(tmp, records)
            os.replace(tmp, self.path)
        except OSError as exc:  # a full disk: the current log stays whole and in use
            tmp.unlink(missing_ok=True)
            log.warning("op log compaction failed: %s", os.strerror(exc.errno or errno.EIO))
            return False
        # From here the path names the new file: appends must go to it, whatever follows.
        self.close()
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            self.size = os.fstat(self._fd).st_size
            self.appended_since_compaction = len(records)
            fsync_dir(self.path.parent)
        except OSError as exc:
            self._broke(f"after compaction: {os.strerror(exc.errno or errno.EIO)}")
            return False
        self.synced = self.appended
        return True

    def _rewrite(self, records: list[Record]) -> None:
        """The log replaced by `records` (repair, migration); RepairFailed without room."""
        tmp = self.path.with_name(self.path.name + ".compact")
        try:
            self._write_file(tmp, records)
            os.replace(tmp, self.path)
            fsync_dir(self.path.parent)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise RepairFailed(f"cannot rewrite the op log: "
                               f"{os.strerror(exc.errno or errno.EIO)}") from None

    @staticmethod
    def _write_file(path: Path, records: list[Record]) -> None:
        with os.fdopen(open_private(path), "wb") as out:
            out.write(oplog_codec.MAGIC)
            for record in records:
                out.write(oplog_codec.encode(record))
            out.flush()
            os.fsync(out.fileno())

    async def settle(self) -> None:
        """Wait for an fsync in flight (before closing)."""
        if self._flush is not None:
            with contextlib.suppress(LogSyncFailed):
                await asyncio.shield(self._flush)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
