"""Reading a file of an image's tree as the machine would see it: every symlink resolved
inside the tree (openat2 RESOLVE_IN_ROOT), never a host file, and bounded in size."""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_SYS_OPENAT2 = 437
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
MAX_BYTES = 1 << 20


def read_in_root(root: Path, path: str, max_bytes: int = MAX_BYTES) -> str | None:
    """The text of `path` inside `root`, or None if it does not exist (or is not a file)."""
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        how = struct.pack("QQQ", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY, 0,
                          _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)
        buf = ctypes.create_string_buffer(how, len(how))
        fd = _libc.syscall(_SYS_OPENAT2, root_fd, os.fsencode(path.lstrip("/") or "."), buf,
                           len(how))
        if fd < 0:
            err = ctypes.get_errno()
            if err in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EXDEV):
                return None
            raise OSError(err, f"{path}: {os.strerror(err)}")
    finally:
        os.close(root_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, max_bytes).decode(errors="replace")
    finally:
        os.close(fd)
