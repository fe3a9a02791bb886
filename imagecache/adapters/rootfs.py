"""A rootfs tree on disk: written without following links, measured, its links checked.

Writes never go through a symlink: every parent component is lstat'ed and
one that is a link refuses the member (`unsafe_layer`), files are created
O_CREAT|O_EXCL|O_NOFOLLOW, hard links only to regular files already there.
`inspect_rootfs` resolves every symlink of a finished tree inside it
(`core.rootlinks`, the disk read by lstat/readlink and never through a link)
and measures what the tree is charged. Blocking IO: call from a thread.
"""

from __future__ import annotations

import errno
import os
import stat
import tarfile
from pathlib import Path

from imagecache.adapters.trees import remove_tree
from imagecache.core.rootlinks import Node, NodeKind, check_link
from imagecache.core.tarsafety import UnpackLimits, Verdict
from imagecache.errors import ImageError

_CHUNK = 1 << 16
# As root the tree keeps the owners its layers name (a machine sees them shifted into its
# user-id range); otherwise everything belongs to the cache's user.
KEEPS_OWNERS = os.geteuid() == 0
# Work allowed to resolve the symlinks of one rootfs: this much, plus as much per link.
_LINK_STEPS = 65536
_LINK_STEPS_PER_LINK = 256


def inspect_rootfs(root: Path, limits: UnpackLimits) -> int:
    """Resolve every symlink of the tree at `root` inside it; return what the tree is charged.

    Raises ImageError("unsafe_layer") naming the first link that leaves the
    root. Charged: regular-file bytes (each inode once) plus `entry_bytes`
    per entry.
    """
    links: list[tuple[str, str]] = []
    seen: set[tuple[int, int]] = set()
    file_bytes = entries = 0
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        with os.scandir(root / rel_dir) as listing:
            for entry in listing:
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                entries += 1
                if entry.is_symlink():
                    links.append((rel, os.readlink(entry.path)))
                elif entry.is_dir(follow_symlinks=False):
                    pending.append(rel)
                elif entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    if st.st_nlink > 1:  # hard links: the data once
                        if (st.st_dev, st.st_ino) in seen:
                            continue
                        seen.add((st.st_dev, st.st_ino))
                    file_bytes += st.st_size
    _check_links(root, links)
    return limits.charged_bytes(file_bytes, entries)


def _check_links(root: Path, links: list[tuple[str, str]]) -> None:
    nodes: dict[str, Node] = {}

    def lookup(rel: str) -> Node:
        node = nodes.get(rel)
        if node is None:
            node = nodes[rel] = _node(root / rel)
        return node

    steps = _LINK_STEPS + _LINK_STEPS_PER_LINK * len(links)
    for rel, target in links:
        check = check_link(rel, target, lookup, max_steps=steps)
        steps -= check.steps
        if check.refusal is not None:
            raise ImageError("unsafe_layer", f"symlink {rel!r} -> {target!r}: {check.refusal}")


def _node(path: Path) -> Node:
    """What is at `path`, whose parents are directories (never followed through a link)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG):
            return Node(NodeKind.MISSING)
        raise
    if stat.S_ISLNK(st.st_mode):
        return Node(NodeKind.SYMLINK, os.readlink(path))
    return Node(NodeKind.DIRECTORY if stat.S_ISDIR(st.st_mode) else NodeKind.OTHER)


def _safe_parent(root: Path, rel: str, *, create: bool) -> Path | None:
    """The on-disk parent dir of `rel`, refusing symlinks; None if missing and not `create`."""
    current = root
    for part in rel.split("/")[:-1]:
        current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            if not create:
                return None
            os.mkdir(current, 0o755)
            continue
        if stat.S_ISLNK(st.st_mode):
            raise ImageError("unsafe_layer", f"member {rel!r}: writes through symlink {part!r}")
        if not stat.S_ISDIR(st.st_mode):
            if not create:
                return None
            os.unlink(current)
            os.mkdir(current, 0o755)
    return current


def remove_path(root: Path, rel: str) -> None:
    """Remove `rel` (whatever it is, a symlink not followed) if its parents are directories."""
    parent = _safe_parent(root, rel, create=False)
    if parent is None:
        return
    remove_tree(parent / rel.rsplit("/", 1)[-1])


def clear_dir(root: Path, rel: str) -> None:
    if rel == "":
        for child in root.iterdir():
            remove_path(root, child.name)
        return
    parent = _safe_parent(root, rel, create=False)
    directory = None if parent is None else parent / rel.rsplit("/", 1)[-1]
    if directory is None or directory.is_symlink() or not directory.is_dir():
        return
    for child in directory.iterdir():
        remove_path(root, f"{rel}/{child.name}")


def write_member(
    archive: tarfile.TarFile, info: tarfile.TarInfo, verdict: Verdict, root: Path
) -> None:
    parent = _safe_parent(root, verdict.path, create=True)
    assert parent is not None
    dest = parent / verdict.path.rsplit("/", 1)[-1]
    existing = _lstat(dest)
    if existing is not None and not (stat.S_ISDIR(existing.st_mode) and info.isdir()):
        remove_path(root, verdict.path)
    mode = info.mode & 0o1777
    if info.isdir():
        if existing is None or not stat.S_ISDIR(existing.st_mode):
            os.mkdir(dest, 0o700)
        os.chmod(dest, mode | 0o700)
    elif info.issym():
        os.symlink(info.linkname, dest)
    elif info.islnk():
        _hardlink(root, verdict, dest)
        return  # the file it links to has its owner
    else:
        _write_file(archive, info, dest, mode)
    if KEEPS_OWNERS:
        os.lchown(dest, info.uid, info.gid)


def _hardlink(root: Path, verdict: Verdict, dest: Path) -> None:
    parent = _safe_parent(root, verdict.link_path, create=False)
    source = None if parent is None else parent / verdict.link_path.rsplit("/", 1)[-1]
    st = None if source is None else _lstat(source)
    if source is None or st is None or not stat.S_ISREG(st.st_mode):
        raise ImageError("unsafe_layer", f"member {verdict.path!r}: hardlink target not a file")
    os.link(source, dest, follow_symlinks=False)


def _write_file(archive: tarfile.TarFile, info: tarfile.TarInfo, dest: Path, mode: int) -> None:
    source = archive.extractfile(info)
    assert source is not None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(dest, flags, 0o600)
    with os.fdopen(fd, "wb") as out, source:
        while chunk := source.read(_CHUNK):
            out.write(chunk)
        os.fchmod(out.fileno(), mode & 0o777)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
