"""Layer members: may this tar entry be written into a rootfs, and as what?

Pure and lexical: judges one member's name, type, link target and mode
(plus the running totals and the set of paths already extracted) and returns
a verdict; `UnpackTally` keeps those totals over the layers of one image,
counting the directories a member's path implies as entries too. It never
touches the disk, so it cannot see symlinks that members create: the
unpacker must refuse to write through any existing symlink component (lstat)
and check every symlink of the finished rootfs (`core.rootlinks`).
Rules: relative names only, no `..`, names and link targets within the
kernel's lengths, paths no deeper than the limit, hard links only to paths
already extracted, no devices or fifos, no setuid/setgid, bounded entries and
unpacked bytes per image. OCI whiteouts are classified here.
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
    uid: int = 0
    gid: int = 0


# Owners a machine can hold: the ids of its user namespace (65536 of them, as Docker's
# userns-remap and Podman refuse ids their map cannot reach).
MAX_OWNER_ID = 65535


@dataclass(frozen=True)
class Verdict:
    action: Action
    path: str = ""  # normalised, relative to the rootfs, no leading "./"
    link_path: str = ""  # hardlinks: normalised target relative to the rootfs
    reason: str = ""


PATH_MAX = 4095  # bytes of a path or link target the kernel takes (4096 with the NUL)
NAME_MAX = 255  # bytes of one path component


@dataclass(frozen=True)
class UnpackLimits:
    """Per image, over all its layers; a layer that crosses one refuses the image."""

    max_bytes: int = 8 * 1024**3  # regular-file bytes (each member's size, overwritten or not)
    max_members: int = 500_000  # entries: tar members plus the directories their paths imply
    entry_bytes: int = 4096  # what one entry is charged against the cache budget, beyond its data
    # Components of a member's path: no real image nests deeper, and a tree thousands deep
    # strains whatever walks it later (its paths alone outgrow PATH_MAX).
    max_path_depth: int = 256

    def charged_bytes(self, file_bytes: int, entries: int) -> int:
        """What an unpacked tree of `file_bytes` in `entries` entries costs the budget."""
        return file_bytes + entries * self.entry_bytes


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


def _plausible_link(target: str) -> bool:
    """Where a link leads depends on the links beside it, so that is checked on the
    finished rootfs (`core.rootlinks`); here only what no link target may be."""
    size = len(target.encode("utf-8", "surrogateescape"))
    return bool(target) and "\x00" not in target and size <= PATH_MAX


def _too_long(text: str) -> bool:
    raw = text.encode("utf-8", "surrogateescape")
    return len(raw) > PATH_MAX or any(len(part) > NAME_MAX for part in raw.split(b"/"))


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
    if _too_long(member.name):
        return _refuse(member, f"name over {PATH_MAX} bytes or a component over {NAME_MAX}")
    if path.count("/") + 1 > limits.max_path_depth:
        return _refuse(member, f"path deeper than {limits.max_path_depth} components")
    if used_members + 1 > limits.max_members:
        return _refuse(member, f"more than {limits.max_members} entries")
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
    if not (0 <= member.uid <= MAX_OWNER_ID and 0 <= member.gid <= MAX_OWNER_ID):
        return _refuse(member, f"owner {member.uid}:{member.gid} is outside the ids a machine "
                       f"has (0..{MAX_OWNER_ID})")
    if member.kind is MemberKind.SYMLINK and not _plausible_link(member.linkname):
        return _refuse(member, "empty, NUL-bearing or over-long symlink target")
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


class UnpackTally:
    """Running totals over the layers of one image, in member order.

    `file_bytes` and `entries` only grow: an upper bound of what the rootfs
    can hold at any point of the unpack (whiteouts are not subtracted).
    A directory a member's path implies is an entry when first implied.
    """

    def __init__(self, limits: UnpackLimits) -> None:
        self.limits = limits
        self.file_bytes = 0
        self.entries = 0
        self.extracted: set[str] = set()
        self._dirs: set[str] = set()  # every directory made or implied, with its ancestors

    @property
    def charged_bytes(self) -> int:
        return self.limits.charged_bytes(self.file_bytes, self.entries)

    def admit(self, member: Member) -> Verdict:
        """Judge `member` against the totals so far; count it unless refused."""
        verdict = judge(
            member,
            extracted=self.extracted,
            used_bytes=self.file_bytes,
            used_members=self.entries,
            limits=self.limits,
        )
        if verdict.action is Action.REFUSE:
            return verdict
        implied = self._implied(verdict.path) if verdict.action is Action.EXTRACT else []
        if self.entries + 1 + len(implied) > self.limits.max_members:
            return _refuse(member, f"more than {self.limits.max_members} entries")
        self.entries += 1 + len(implied)
        self.file_bytes += max(member.size, 0)
        self._dirs.update(implied)
        if verdict.action is Action.EXTRACT:
            self.extracted.add(verdict.path)
            if member.kind is MemberKind.DIR:
                self._dirs.add(verdict.path)
        return verdict

    def _implied(self, path: str) -> list[str]:
        """Ancestors of `path` not seen before (stops at the first seen: its own are too)."""
        missing: list[str] = []
        parent = posixpath.dirname(path)
        while parent and parent not in self._dirs:
            missing.append(parent)
            parent = posixpath.dirname(parent)
        return missing
