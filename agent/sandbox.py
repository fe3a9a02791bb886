"""The bubblewrap command line of a machine: the host's system dirs read-only, the image's
rootfs at /app, its own pid, ipc and uts namespaces (docs/process-driver.md)."""

from __future__ import annotations

import os
from pathlib import Path

SANDBOX_APP_DIR = "/app"
HOST_SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc")


def system_bind_args(dirs: tuple[str, ...] = HOST_SYSTEM_DIRS) -> list[str]:
    """bwrap arguments exposing the host's system dirs read-only; a merged-/usr
    symlink (/bin -> usr/bin) is recreated as the same symlink."""
    args: list[str] = []
    for path in dirs:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def sandbox_argv(bwrap: str, system_binds: list[str], rootfs: Path, rel_workdir: str) -> list[str]:
    """The bwrap command line up to and including ``--``; the app's argv follows."""
    chdir = f"{SANDBOX_APP_DIR}/{rel_workdir}" if rel_workdir else SANDBOX_APP_DIR
    return [
        bwrap,
        *system_binds,
        *("--ro-bind", str(rootfs), SANDBOX_APP_DIR),
        *("--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"),
        *("--unshare-pid", "--unshare-ipc", "--unshare-uts"),
        *("--chdir", chdir),
        "--",
    ]
