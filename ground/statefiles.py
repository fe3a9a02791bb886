"""State files that may hold secrets are the service user's alone: files 0600, dirs 0700.

Apps' env (placement's SQLite and its -wal/-shm, the agent's op log, a machine's
config.json), tokens, keys and machine logs live in state dirs. Each is created with
its mode (never widened later by a rename or the umask) and a dir or file made by an
older version is tightened when a service starts. No process-wide umask: the image
trees machines run from keep the modes their images give them (a umask would close
the dirs an unpack makes implicitly to a machine's own users), and they are reached
only through the 0700 state dir above them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def make_dirs(path: Path, mode: int) -> None:
    """`path` and its missing parents made with `mode` (whatever the umask)."""
    missing = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        directory.mkdir(mode=mode, exist_ok=True)
        os.chmod(directory, mode)


def private_dir(path: Path) -> Path:
    """`path` made 0700 (with its missing parents, 0700 too) or tightened to 0700;
    returns it."""
    make_dirs(path, DIR_MODE)
    os.chmod(path, DIR_MODE)
    return path


def tighten(*paths: Path) -> None:
    """Regular files that exist made 0600 (anything else — missing, a device, a symlink —
    is left as it is)."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.chmod(path, FILE_MODE, follow_symlinks=False)


def open_private(path: Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """A file descriptor of `path`, created 0600 (and an existing regular file made 0600;
    anything else — /dev/null, a FIFO the agent made — keeps its mode: tightening
    /dev/null would break every other user of the host)."""
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: Path, data: bytes, temp_prefix: str = ".") -> None:
    """`path` replaced whole by `data` through a 0600 temp file of its own (durable:
    fsynced; concurrent writers never share a temp file)."""
    temp = path.with_name(f"{temp_prefix}{path.name}-{secrets.token_hex(4)}.tmp")
    fd = open_private(temp)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Held by one process of the host at a time (flock on `path`, made 0600): for a
    read-modify-write of state that several processes change."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
