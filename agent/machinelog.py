"""Per-machine stdout/stderr logs: read the tail, keep the file bounded."""

from __future__ import annotations

import os
from pathlib import Path


def read_log(path: Path, tail_bytes: int) -> bytes:
    """The last ``tail_bytes`` bytes of the log (b"" if there is no log)."""
    return read_log_from(path, -1, tail_bytes)[2]


MAX_READ_BYTES = 1 << 20


def read_log_from(path: Path, offset: int, max_bytes: int) -> tuple[int, int, bytes]:
    """Up to ``max_bytes`` of the log from byte ``offset``: (start, size, data), where
    ``start`` is where ``data`` begins and ``size`` the log's size now. A negative offset,
    or one past the end (the log was trimmed since), starts at the last ``max_bytes``:
    a follower that passes ``start + len(data)`` back reads each byte once, and after a
    trim picks up from the kept tail."""
    max_bytes = max(0, min(max_bytes, MAX_READ_BYTES))
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if offset < 0 or offset > size:
                offset = max(0, size - max_bytes)
            f.seek(offset)
            return offset, size, f.read(max_bytes)
    except FileNotFoundError:
        return 0, 0, b""


def trim_log(path: Path, max_bytes: int, keep_bytes: int) -> bool:
    """Copy-truncate: if the log exceeds ``max_bytes``, keep only its last
    ``keep_bytes``. The writer uses O_APPEND, so its next write lands at the new
    end. Bytes appended during the trim are carried over, except in the last
    instant between the final size check and the truncate. True if trimmed."""
    if not 0 <= keep_bytes <= max_bytes:
        raise ValueError("need 0 <= keep_bytes <= max_bytes")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        size = os.fstat(fd).st_size
        if size <= max_bytes:
            return False
        kept = os.pread(fd, keep_bytes, size - keep_bytes)
        os.pwrite(fd, kept, 0)
        end, length = size, len(kept)
        while (now := os.fstat(fd).st_size) > end:
            late = os.pread(fd, now - end, end)
            os.pwrite(fd, late, length)
            end, length = end + len(late), length + len(late)
        os.ftruncate(fd, length)
        return True
    finally:
        os.close(fd)
