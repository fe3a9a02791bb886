"""Per-machine stdout/stderr logs: read the tail, keep the file bounded."""

from __future__ import annotations

import os
from pathlib import Path


def read_log(path: Path, tail_bytes: int) -> bytes:
    """The last ``tail_bytes`` bytes of the log (b"" if there is no log)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - tail_bytes))
            return f.read(tail_bytes)
    except FileNotFoundError:
        return b""


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
