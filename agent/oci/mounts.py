"""A machine's root filesystem: the image's unpacked layers, shifted into the machine's
user-id range by an idmapped mount, as the read-only lower layer of an overlayfs whose
upper layer is the machine's own (kept while the machine exists).

The image cache keeps one unpacked tree per image with the owners its layers name (0 is
root); the machine sees those files owned by its own root, which is an unprivileged user
on the host (its range starts at `uid_base`). Nothing here ever writes to the cache's
tree: the idmapped view of it is read-only and lives only until the overlay holds it.
Linux >= 5.19 (idmapped layers of overlayfs); the mount API is called through ctypes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ground.statefiles import make_dirs

_libc = ctypes.CDLL(None, use_errno=True)
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_AT_FDCWD = -100
_OPEN_TREE_CLONE = 1
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_IDMAP = 0x00100000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MNT_DETACH = 2
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
UNSHARE = "unshare"


class MountError(OSError):
    pass


@dataclass(frozen=True)
class IdRange:
    """Container ids 0 .. size-1 are host ids base .. base+size-1."""

    base: int
    size: int = 65536


@dataclass(frozen=True)
class MachineRoot:
    """Where a machine's rootfs lives. Its upper layer is kept with the machine's state
    (it outlives a stop); the merged tree is mounted under `run` (tmpfs, like the mount),
    whose path the machine's root must be able to walk: runc mounts it from inside the
    machine's user namespace, where the agent's 0700 state dirs are closed to it."""

    state: Path  # the machine's dir: upper/ and work/
    run: Path  # the machine's run dir: rootfs/ (the merged tree) and .lower

    @property
    def upper(self) -> Path:
        return self.state / "upper"

    @property
    def work(self) -> Path:
        return self.state / "work"

    @property
    def merged(self) -> Path:
        return self.run / "rootfs"

    @property
    def lower_view(self) -> Path:
        return self.run / ".lower"


def mount_root(root: MachineRoot, image_rootfs: Path, ids: IdRange) -> None:
    """Mount the machine's rootfs at `root.merged` (idempotent: kept if mounted)."""
    if is_mountpoint(root.merged):
        return
    for path in (root.upper, root.work):
        path.mkdir(mode=0o700, exist_ok=True)
    walkable_dir(root.run)
    for path in (root.merged, root.lower_view):
        path.mkdir(mode=0o755, exist_ok=True)
    # The overlay takes its root's owner and mode from the upper dir when it is mounted:
    # the image's root dir's, shifted (0700 would lock every user but root out of `/`).
    image_root = os.stat(image_rootfs)
    os.chown(root.upper, ids.base + image_root.st_uid, ids.base + image_root.st_gid)
    os.chmod(root.upper, stat.S_IMODE(image_root.st_mode))
    with _userns(ids) as userns_fd:
        _idmapped_bind(image_rootfs, root.lower_view, userns_fd)
    try:
        options = f"lowerdir={root.lower_view},upperdir={root.upper},workdir={root.work}"
        # nosuid: the tree is walkable from the host (runc needs it), and a tenant may
        # chmod 4755 its own files; no host user may gain the machine's ids through them.
        # Inside, no_new_privs already makes setuid bits inert.
        _mount("overlay", root.merged, "overlay", _MS_NODEV | _MS_NOSUID, options)
    finally:
        _umount(root.lower_view, _MNT_DETACH)  # the overlay keeps its own clone of it


def unmount_root(root: MachineRoot) -> None:
    for path in (root.merged, root.lower_view):
        while is_mountpoint(path):
            _umount(path, _MNT_DETACH)


def unwalkable_parent(path: Path) -> Path | None:
    """The first existing dir on the way to `path` that other users may not walk (no
    o+x): a machine's root, an unprivileged id outside, could not reach its rootfs."""
    for parent in [*reversed(path.parents), path]:
        try:
            mode = os.stat(parent).st_mode
        except FileNotFoundError:
            return None
        if not mode & 0o001:
            return parent
    return None


def walkable_dir(path: Path) -> None:
    """Make `path` (and missing parents) a dir anyone may walk but not list (0711)."""
    make_dirs(path, 0o711)


def is_mountpoint(path: Path) -> bool:
    try:
        return os.path.ismount(path)
    except OSError:
        return False


class _userns:
    """A user namespace with the machine's mapping, held open as an fd while needed:
    a child process unshares it and waits; we write its maps (we are root outside)."""

    def __init__(self, ids: IdRange) -> None:
        self.ids = ids
        self.proc: subprocess.Popen[bytes] | None = None
        self.fd = -1

    def __enter__(self) -> int:
        proc = subprocess.Popen([UNSHARE, "--user", "--", "/bin/sh", "-c", "echo; read x"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)
        self.proc = proc
        assert proc.stdout is not None
        if proc.stdout.readline() != b"\n":
            raise MountError(errno.EPERM, "cannot make a user namespace (unshare --user)")
        mapping = f"0 {self.ids.base} {self.ids.size}\n"
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{proc.pid}/{name}", "w") as out:
                out.write(mapping)
        self.fd = os.open(f"/proc/{proc.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        return self.fd

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        if self.proc is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait()
            assert self.proc.stdout is not None
            self.proc.stdout.close()


def _idmapped_bind(source: Path, target: Path, userns_fd: int) -> None:
    """Bind `source` read-only at `target`, its owners shifted through `userns_fd`."""
    tree = _check(_libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(source),
                                _OPEN_TREE_CLONE | os.O_CLOEXEC), f"open_tree {source}")
    try:
        attr = struct.pack("QQQQ", _MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY, 0, 0, userns_fd)
        buf = ctypes.create_string_buffer(attr, len(attr))
        _check(_libc.syscall(_SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH, buf, len(attr)),
               f"idmapping {source}")
        _check(_libc.syscall(_SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, os.fsencode(target),
                             _MOVE_MOUNT_F_EMPTY_PATH), f"mounting {target}")
    finally:
        os.close(tree)


def _mount(source: str, target: Path, fstype: str, flags: int, options: str) -> None:
    _check(_libc.mount(source.encode(), os.fsencode(target), fstype.encode(), flags,
                       options.encode()), f"mount {fstype} at {target}")


def _umount(target: Path, flags: int) -> None:
    if _libc.umount2(os.fsencode(target), flags) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # not mounted (any more)
            raise MountError(err, f"umount {target}: {os.strerror(err)}")


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise MountError(err, f"{what}: {os.strerror(err)}")
    return result
