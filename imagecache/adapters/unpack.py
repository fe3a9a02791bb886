"""Apply layer tarballs, in order, into a fresh rootfs directory — safely, within limits.

Two passes over the layers. `plan_unpack` reads every layer once without
writing: each member is judged (`core.tarsafety`), the image's entries and
bytes are tallied against its limits and the room the cache can make, and
the sha256 of each uncompressed tar is checked against its diff_id — so a
refused image costs no disk at all. `build_rootfs` reads them again and
writes (`adapters/rootfs`: never through a symlink, whatever earlier members
made); whiteouts of a layer are applied before any of its entries are written (an
opaque directory clears only lower layers); the diff_ids are checked again,
so what was written is what was checked. Then every symlink of the finished
tree is resolved inside it (`core.rootlinks`) and the tree is measured. The
rootfs is built under a temp name and renamed when complete; on any failure
the temp tree is removed. Runs in a worker thread: all blocking IO. Every
failure is an ImageError: `unsafe_layer`, `digest_mismatch`, `no_space`,
`io_error`.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import os
import secrets
import tarfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import BinaryIO

from imagecache.adapters.blobstore import TEMP_PREFIX
from imagecache.adapters.rootfs import clear_dir, inspect_rootfs, remove_path, write_member
from imagecache.adapters.trees import remove_tree, remove_tree_quietly
from imagecache.core.tarsafety import (
    Action,
    Member,
    MemberKind,
    UnpackLimits,
    UnpackTally,
    Verdict,
)
from imagecache.errors import ImageError, os_failure

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
# Tar bytes beyond the members' data (headers, padding, PAX records, end
# blocks) are bounded twice: over a layer, so it cannot make us decompress
# gigabytes no member accounts for; and between two members, because tarfile
# holds a PAX header in memory whole.
_HEADER_BYTES_PER_ENTRY = 8192
_MAX_HEADER_BYTES = 1 << 20
# Errors the layer's content causes (the same on any host): the layer is refused.
_CONTENT_ERRNOS = frozenset(
    {errno.ENAMETOOLONG, errno.EMLINK, errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.EEXIST,
     errno.EINVAL, errno.ENOTEMPTY}
)


@dataclass(frozen=True)
class LayerFile:
    path: Path  # the verified blob (gzip or plain tar)
    diff_id: str  # sha256 of its uncompressed tar, from the image config


@dataclass(frozen=True)
class UnpackPlan:
    layers: list[LayerFile]
    removals: list[list[Verdict]]  # per layer: its whiteouts and opaque markers
    charged_bytes: int  # the most the rootfs can cost the budget while it is built


# bytes needed -> why they do not fit (the cache's standing, taken before the plan)
NoRoom = Callable[[int], str]


def plan_unpack(
    layers: list[LayerFile], limits: UnpackLimits, room_bytes: int, no_room: NoRoom
) -> UnpackPlan:
    """Judge, measure and verify every layer without writing; raise ImageError to refuse.

    `room_bytes`: the most the cache could make room for; beyond it, no_space
    with `no_room`'s reason, as soon as the tally crosses it.
    """
    tally = UnpackTally(limits)
    removals: list[list[Verdict]] = []
    for layer in layers:
        removals.append([])
        note = partial(_note_removal, removals[-1], tally, room_bytes, no_room)
        with _translated(layer):
            _read_layer(layer, tally, note)
    return UnpackPlan(layers=layers, removals=removals, charged_bytes=tally.charged_bytes)


def _note_removal(
    found: list[Verdict],
    tally: UnpackTally,
    room_bytes: int,
    no_room: NoRoom,
    verdict: Verdict,
    _info: tarfile.TarInfo,
    _archive: tarfile.TarFile,
) -> None:
    if verdict.action in (Action.WHITEOUT, Action.OPAQUE):
        found.append(verdict)
    if tally.charged_bytes > room_bytes:
        raise ImageError("no_space", f"unpacked, at least {no_room(tally.charged_bytes)}")


def build_rootfs(plan: UnpackPlan, target: Path, limits: UnpackLimits) -> int:
    """Build `target` from the plan's layers via a temp dir beside it; return its charged bytes.

    Whatever fails, the temp dir is removed (iteratively: a layer may nest
    thousands of directories) before the exception leaves.
    """
    temp = target.with_name(f"{TEMP_PREFIX}{target.name}-{secrets.token_hex(4)}")
    tally = UnpackTally(limits)
    try:
        _fresh_dir(temp)
        for layer, removals in zip(plan.layers, plan.removals, strict=True):
            with _translated(layer):
                _apply_layer(layer, removals, temp, tally)
        with _translated(None):
            charged = inspect_rootfs(temp, limits)
            if target.exists():
                remove_tree(target)  # a stale tree nothing recorded
            os.rename(temp, target)
    except BaseException:
        remove_tree_quietly(temp)
        raise
    return charged


def _fresh_dir(path: Path) -> None:
    with _translated(None):
        remove_tree(path)
        path.mkdir(mode=0o755)


@contextmanager
def _translated(layer: LayerFile | None) -> Iterator[None]:
    """Turn what tarfile, gzip and the file system raise into ImageError."""
    what = "rootfs" if layer is None else f"layer {layer.path.name}"
    try:
        yield
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ImageError("unsafe_layer", f"{what}: unreadable tar: {exc}") from None
    except OSError as exc:
        if exc.errno in _CONTENT_ERRNOS:
            raise ImageError("unsafe_layer", f"{what}: cannot be written: {exc.strerror}") from None
        raise os_failure(exc, f"unpacking {what}") from None


class _StreamBound:
    """How far a layer's uncompressed tar may run, given what its members account for."""

    def __init__(self, tally: UnpackTally) -> None:
        self._tally = tally
        self._start = (tally.file_bytes, tally.entries)
        self._gap_end = _MAX_HEADER_BYTES  # before the first member: its header

    def admitted(self, position: int, size: int) -> None:
        """A member of `size` data bytes was admitted with the stream at `position`."""
        self._gap_end = position + size + _MAX_HEADER_BYTES

    def __call__(self) -> int:
        data = self._tally.file_bytes - self._start[0]
        members = self._tally.entries - self._start[1] + 1
        return min(data + members * _HEADER_BYTES_PER_ENTRY + _MAX_HEADER_BYTES, self._gap_end)


class _HashingReader:
    """The uncompressed tar stream: hashed as read, and refused past its bound."""

    def __init__(self, raw: BinaryIO, bound: _StreamBound, layer: str) -> None:
        self._raw = raw
        self._bound = bound
        self._layer = layer
        self._hash = hashlib.sha256()
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size if size >= 0 else _CHUNK)
        self.count += len(data)
        if self.count > self._bound():
            raise ImageError(
                "unsafe_layer", f"layer {self._layer}: more tar data than its members account for"
            )
        self._hash.update(data)
        return data

    def digest(self) -> str:
        return "sha256:" + self._hash.hexdigest()


Visit = Callable[[Verdict, tarfile.TarInfo, tarfile.TarFile], None]


def _read_layer(layer: LayerFile, tally: UnpackTally, visit: Visit) -> None:
    """Admit every member of `layer` into `tally`, `visit` each, then check the diff_id."""
    bound = _StreamBound(tally)
    with open(layer.path, "rb") as raw:
        compressed = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        stream: BinaryIO = gzip.GzipFile(fileobj=raw, mode="rb") if compressed else raw
        reader = _HashingReader(stream, bound, layer.path.name)
        with tarfile.open(fileobj=reader, mode="r|") as archive:  # type: ignore[call-overload]
            for info in archive:
                member = _member(info)
                verdict = tally.admit(member)
                if verdict.action is Action.REFUSE:
                    raise ImageError("unsafe_layer", f"layer {layer.path.name}: {verdict.reason}")
                bound.admitted(reader.count, member.size)
                visit(verdict, info, archive)
        while reader.read(_CHUNK):
            pass  # the end blocks and padding count toward the diff_id
    if reader.digest() != layer.diff_id:
        raise ImageError(
            "digest_mismatch",
            f"layer {layer.path.name}: uncompressed it hashes to {reader.digest()}, "
            f"not to its diff_id {layer.diff_id}",
        )


def _member(info: tarfile.TarInfo) -> Member:
    return Member(
        name=info.name,
        kind=_KINDS.get(info.type, MemberKind.OTHER),
        linkname=info.linkname,
        mode=info.mode,
        size=info.size if info.isreg() else 0,
        uid=info.uid,
        gid=info.gid,
    )


def _apply_layer(layer: LayerFile, removals: list[Verdict], root: Path, tally: UnpackTally) -> None:
    for verdict in removals:
        if verdict.action is Action.WHITEOUT:
            remove_path(root, verdict.path)
        else:
            clear_dir(root, verdict.path)

    def write(verdict: Verdict, info: tarfile.TarInfo, archive: tarfile.TarFile) -> None:
        if verdict.action is Action.EXTRACT:
            write_member(archive, info, verdict, root)

    _read_layer(layer, tally, write)


