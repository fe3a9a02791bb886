"""Layer members: may this tar entry be written into a rootfs, and as what?

Pure and lexical: judges one member's name, type, link target and mode
(plus the running totals and the set of paths already extracted) and returns
a verdict. It never touches the disk, so it cannot see symlinks that earlier
members created; the unpacker must also refuse to write through any existing
symlink component (checked with lstat), which this module cannot know about.
Rules: relative names only, no `..`, no link target leaving the root, hard
links only to paths already extracted, no devices or fifos, no setuid/setgid,
bounded member count and unpacked bytes. OCI whiteouts are classified here.
"""

from __future__ import annotations

import posixpath
from collections.abc import Container
from dataclasses import dataclass
from enum import Enum

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"


class MemberKind(Enum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    HARDLINK = "hardlink"
    CHAR_DEVICE = "char_device"
    BLOCK_DEVICE = "block_device"
    FIFO = "fifo"
    OTHER = "other"


class Action(Enum):
    EXTRACT = "extract"  # write `path` (kind as given)
    WHITEOUT = "whiteout"  # delete `path` from lower layers
    OPAQUE = "opaque"  # clear lower-layer content of directory `path`
    SKIP = "skip"  # the root itself: nothing to do
    REFUSE = "refuse"  # the whole layer is unsafe; `reason` says why


@dataclass(frozen=True)
class Member:
    name: str
    kind: MemberKind
    linkname: str = ""
    mode: int = 0o644
    size: int = 0


@dataclass(frozen=True)
class Verdict:
    action: Action
    path: str = ""  # normalised, relative to the rootfs, no leading "./"
    link_path: str = ""  # hardlinks: normalised target relative to the rootfs
    reason: str = ""


@dataclass(frozen=True)
class UnpackLimits:
    max_bytes: int = 8 * 1024**3  # total regular-file bytes over all layers
    max_members: int = 500_000  # total tar members over all layers


def normalise(name: str) -> str | None:
    """`name` as a clean relative path ("" for the root), or None if absolute or climbing."""
    if not name or "\x00" in name or name.startswith("/"):
        return None
    parts: list[str] = []
    for part in name.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            return None
        parts.append(part)
    return "/".join(parts)


def symlink_stays_inside(path: str, target: str) -> bool:
    """Does a symlink at `path` pointing to `target` resolve inside the root?

    Absolute targets are read as rooted at the rootfs (container semantics);
    relative ones are resolved from the link's own directory.
    """
    if not target or "\x00" in target:
        return False
    if target.startswith("/"):
        return True
    joined = posixpath.join(posixpath.dirname(path), target)
    depth = 0
    for part in joined.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        elif part not in ("", "."):
            depth += 1
    return True


def judge(
    member: Member,
    *,
    extracted: Container[str],
    used_bytes: int,
    used_members: int,
    limits: UnpackLimits,
) -> Verdict:
    """The verdict for one member; `used_*` are totals before this member."""
    path = normalise(member.name)
    if path is None:
        return _refuse(member, "absolute path or '..' component")
    if used_members + 1 > limits.max_members:
        return _refuse(member, f"more than {limits.max_members} members")
    if used_bytes + max(member.size, 0) > limits.max_bytes:
        return _refuse(member, f"unpacked size over {limits.max_bytes} bytes")
    if path == "":
        return Verdict(Action.SKIP) if member.kind is MemberKind.DIR else _refuse(member, "root")
    base = posixpath.basename(path)
    if base.startswith(WHITEOUT_PREFIX):
        return _whiteout(member, path, base)
    return _judge_kind(member, path, extracted)


def _judge_kind(member: Member, path: str, extracted: Container[str]) -> Verdict:
    if member.kind in (MemberKind.CHAR_DEVICE, MemberKind.BLOCK_DEVICE, MemberKind.FIFO):
        return _refuse(member, f"{member.kind.value} not allowed")
    if member.kind is MemberKind.OTHER:
        return _refuse(member, "unsupported member type")
    if member.mode & 0o6000:
        return _refuse(member, "setuid/setgid bit set")
    if member.kind is MemberKind.SYMLINK and not symlink_stays_inside(path, member.linkname):
        return _refuse(member, f"symlink target {member.linkname!r} escapes the root")
    if member.kind is MemberKind.HARDLINK:
        target = normalise(member.linkname)
        if not target:
            return _refuse(member, f"hardlink target {member.linkname!r} is outside the root")
        if target not in extracted:
            return _refuse(member, f"hardlink target {member.linkname!r} not extracted yet")
        return Verdict(Action.EXTRACT, path=path, link_path=target)
    return Verdict(Action.EXTRACT, path=path)


def _whiteout(member: Member, path: str, base: str) -> Verdict:
    parent = posixpath.dirname(path)
    if base == OPAQUE_MARKER:
        return Verdict(Action.OPAQUE, path=parent)
    hidden = base[len(WHITEOUT_PREFIX) :]
    if hidden in ("", ".", "..") or hidden.startswith(WHITEOUT_PREFIX):
        return _refuse(member, "malformed whiteout")
    return Verdict(Action.WHITEOUT, path=posixpath.join(parent, hidden))


def _refuse(member: Member, why: str) -> Verdict:
    return Verdict(Action.REFUSE, reason=f"member {member.name!r}: {why}")
