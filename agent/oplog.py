"""The op log on disk: append + fsync before acting, replay on start, compaction.

Framing and checksums live in `agent.core.oplog_codec`; this module only does
the file IO. A torn tail (the agent died mid-append) is cut off at open.
"""

from __future__ import annotations

import os
from pathlib import Path

from agent.core import oplog_codec
from agent.core.records import Record
from thaw.durable import fsync_dir


class OpLog:
    """Append-only, one writer. Every `append` is durable when it returns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self.appended_since_compaction = 0
        self.dropped_torn_tail = False

    def open(self) -> list[Record]:
        """Read every valid record, cut a torn tail, and open for appending."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = self.path.read_bytes() if self.path.exists() else b""
        decoded = oplog_codec.decode(data)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        if decoded.torn:
            os.ftruncate(self._fd, decoded.valid_bytes)
            os.fsync(self._fd)
            self.dropped_torn_tail = True
        fsync_dir(self.path.parent)
        self.appended_since_compaction = len(decoded.records)
        return decoded.records

    def append(self, record: Record) -> None:
        if self._fd is None:
            raise RuntimeError("op log is not open")
        frame = oplog_codec.encode(record)
        written = os.write(self._fd, frame)
        if written != len(frame):
            raise OSError(f"short write to op log ({written} of {len(frame)} bytes)")
        os.fsync(self._fd)
        self.appended_since_compaction += 1

    def compact(self, records: list[Record]) -> None:
        """Replace the log by `records` atomically (write, fsync, rename, fsync dir)."""
        tmp = self.path.with_name(self.path.name + ".compact")
        with open(tmp, "wb") as out:
            for record in records:
                out.write(oplog_codec.encode(record))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        self.close()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.appended_since_compaction = len(records)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
