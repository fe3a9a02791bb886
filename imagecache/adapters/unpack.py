"""Apply layer tarballs, in order, into a fresh rootfs directory — safely.

Every member is judged by `core.tarsafety.judge` (lexical rules) and then
checked on disk: no parent component may be a symlink (lstat each one), so
nothing is ever written through a link, whatever earlier members created.
Whiteouts of a layer are applied before any of its entries are written, so
an opaque directory clears only lower layers. Runs in a worker thread: all
blocking IO. The rootfs is built under a temp name and renamed when complete;
on refusal the temp tree is removed and ImageError("unsafe_layer") raised.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

from imagecache.core.tarsafety import (
    Action,
    Member,
    MemberKind,
    UnpackLimits,
    Verdict,
    judge,
)
from imagecache.errors import ImageError

_KINDS = {
    tarfile.REGTYPE: MemberKind.FILE,
    tarfile.AREGTYPE: MemberKind.FILE,
    tarfile.CONTTYPE: MemberKind.FILE,
    tarfile.DIRTYPE: MemberKind.DIR,
    tarfile.SYMTYPE: MemberKind.SYMLINK,
    tarfile.LNKTYPE: MemberKind.HARDLINK,
    tarfile.CHRTYPE: MemberKind.CHAR_DEVICE,
    tarfile.BLKTYPE: MemberKind.BLOCK_DEVICE,
    tarfile.FIFOTYPE: MemberKind.FIFO,
}
_CHUNK = 1 << 16


def remove_tree(path: Path) -> None:
    """rmtree that also copes with directories we made read-only."""

    def fix(func: object, p: str, _exc: object) -> None:
        os.chmod(os.path.dirname(p), 0o700)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            os.unlink(p)

    if path.exists() or path.is_symlink():
        shutil.rmtree(path, onerror=fix)


class _Tally:
    def __init__(self, limits: UnpackLimits) -> None:
        self.limits = limits
        self.bytes = 0
        self.members = 0
        self.extracted: set[str] = set()


def unpack_layers(layers: list[Path], target: Path, temp: Path, limits: UnpackLimits) -> None:
    """Build `target` from `layers` (gzip or plain tar, bottom first) via the temp dir `temp`."""
    remove_tree(temp)
    temp.mkdir(mode=0o755)
    tally = _Tally(limits)
    try:
        for layer in layers:
            _apply_layer(layer, temp, tally)
        os.rename(temp, target)
    except BaseException:
        remove_tree(temp)
        raise


def _apply_layer(layer: Path, root: Path, tally: _Tally) -> None:
    try:
        plan = list(_judged(layer, tally))
        for verdict, _ in plan:
            if verdict.action is Action.WHITEOUT:
                _remove(root, verdict.path)
            elif verdict.action is Action.OPAQUE:
                _clear_dir(root, verdict.path)
        with tarfile.open(layer, mode="r:*") as archive:
            # Second read of the same file: members come in the same order as judged.
            for (verdict, judged), info in zip(plan, archive, strict=True):
                if info.name != judged.name:
                    raise ImageError("unsafe_layer", f"layer {layer.name}: changed while reading")
                if verdict.action is Action.EXTRACT:
                    _write_member(archive, info, verdict, root)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ImageError("unsafe_layer", f"layer {layer.name}: unreadable tar: {exc}") from None


def _judged(layer: Path, tally: _Tally) -> Iterator[tuple[Verdict, tarfile.TarInfo]]:
    with tarfile.open(layer, mode="r:*") as archive:
        for info in archive:
            member = Member(
                name=info.name,
                kind=_KINDS.get(info.type, MemberKind.OTHER),
                linkname=info.linkname,
                mode=info.mode,
                size=info.size if info.isreg() else 0,
            )
            verdict = judge(
                member,
                extracted=tally.extracted,
                used_bytes=tally.bytes,
                used_members=tally.members,
                limits=tally.limits,
            )
            if verdict.action is Action.REFUSE:
                raise ImageError("unsafe_layer", f"layer {layer.name}: {verdict.reason}")
            tally.members += 1
            tally.bytes += member.size
            if verdict.action is Action.EXTRACT:
                tally.extracted.add(verdict.path)
            yield verdict, info


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


def _remove(root: Path, rel: str) -> None:
    parent = _safe_parent(root, rel, create=False)
    if parent is None:
        return
    victim = parent / rel.rsplit("/", 1)[-1]
    if victim.is_symlink() or victim.is_file():
        victim.unlink()
    elif victim.is_dir():
        remove_tree(victim)


def _clear_dir(root: Path, rel: str) -> None:
    if rel == "":
        for child in root.iterdir():
            _remove(root, child.name)
        return
    parent = _safe_parent(root, rel, create=False)
    directory = None if parent is None else parent / rel.rsplit("/", 1)[-1]
    if directory is None or directory.is_symlink() or not directory.is_dir():
        return
    for child in directory.iterdir():
        _remove(root, f"{rel}/{child.name}")


def _write_member(
    archive: tarfile.TarFile, info: tarfile.TarInfo, verdict: Verdict, root: Path
) -> None:
    parent = _safe_parent(root, verdict.path, create=True)
    assert parent is not None
    dest = parent / verdict.path.rsplit("/", 1)[-1]
    existing = _lstat(dest)
    if existing is not None and not (stat.S_ISDIR(existing.st_mode) and info.isdir()):
        _remove(root, verdict.path)
    mode = info.mode & 0o1777
    if info.isdir():
        if existing is None or not stat.S_ISDIR(existing.st_mode):
            os.mkdir(dest, 0o700)
        os.chmod(dest, mode | 0o700)
    elif info.issym():
        os.symlink(info.linkname, dest)
    elif info.islnk():
        _hardlink(root, verdict, dest)
    else:
        _write_file(archive, info, dest, mode)


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
