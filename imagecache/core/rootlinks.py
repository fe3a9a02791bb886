"""Symlinks of an unpacked rootfs: does following one stay inside the root?

Decides for one link, given a way to look at what the rootfs holds, by
resolving its target component by component the way `openat2` with
`RESOLVE_IN_ROOT` would: from the link's own directory (an absolute target
from the rootfs root), following every link the rootfs itself holds. Where
RESOLVE_IN_ROOT would clamp a `..` at the root, the link is refused instead:
on the host nothing clamps it, and `b -> .` then `a -> b/b/../..` would leave
the root although it reads as staying inside. Invariants: a component that
does not exist, or is not a directory, ends the use of the disk and the rest
is read lexically (stricter than the host, which would fail there); no more
than MAX_LINKS links are followed per resolution (the Linux limit, refused
rather than reported as a loop); work is bounded by `max_steps`. It must not
know about files: the caller's `Lookup` reads the disk.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

MAX_LINKS = 40


class NodeKind(Enum):
    MISSING = "missing"
    DIRECTORY = "directory"
    SYMLINK = "symlink"
    OTHER = "other"  # a file, or anything else that is not a directory


@dataclass(frozen=True)
class Node:
    kind: NodeKind
    target: str = ""  # symlinks only: the link's text


# rootfs-relative path, every parent of which is a directory -> what is there
Lookup = Callable[[str], Node]


@dataclass(frozen=True)
class LinkCheck:
    refusal: str | None  # None: the link resolves inside the root
    steps: int  # components processed, against the caller's work budget


def check_link(path: str, target: str, lookup: Lookup, *, max_steps: int) -> LinkCheck:
    """Resolve the symlink at rootfs-relative `path` whose text is `target`."""
    current = [] if target.startswith("/") else path.split("/")[:-1]
    pending = deque(target.split("/"))
    links = steps = 0
    on_disk = True  # False once a component is missing or not a directory
    while pending:
        steps += 1
        if steps > max_steps:
            return LinkCheck(f"takes more than {max_steps} steps to resolve", steps)
        part = pending.popleft()
        if part in ("", "."):
            continue
        if part == "..":
            if not current:
                return LinkCheck("climbs above the root", steps)
            current.pop()
            continue
        current.append(part)
        if not on_disk:
            continue
        node = lookup("/".join(current))
        if node.kind is NodeKind.SYMLINK:
            links += 1
            if links > MAX_LINKS:
                return LinkCheck(f"follows more than {MAX_LINKS} links", steps)
            current.pop()
            if node.target.startswith("/"):
                current = []
            pending.extendleft(reversed(node.target.split("/")))
        elif node.kind is not NodeKind.DIRECTORY:
            on_disk = False
    return LinkCheck(None, steps)
