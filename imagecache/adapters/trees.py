"""Removing a directory tree: iteratively, relative to directory fds, never through a link.

A tree unpacked from a layer may be thousands of directories deep, with
paths far longer than PATH_MAX, so removal neither recurses nor builds
paths: it walks down with `openat(O_DIRECTORY | O_NOFOLLOW)` and back up
through `..` (checked to be the directory it came from), holds a few
directory fds, not one per level, and unlinks every entry relative to its
own directory. A symlink is unlinked, never followed; a directory on another
file system (a mount point) is not entered. An entry that fails is
remembered and the walk goes on, so one bad entry leaves behind only itself
and its ancestors. Blocking IO.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OWNER_RWX = stat.S_IRWXU

Identity = tuple[int, int]  # (st_dev, st_ino) of a directory


@dataclass
class _Level:
    """A directory on the way down: its name in its parent, and its subdirectories to go."""

    name: str
    identity: Identity
    subdirs: list[str] = field(default_factory=list)


def remove_tree(path: Path) -> None:
    """Remove `path` and everything below it; a symlink is removed itself, not followed.

    Every entry is tried; then the first OSError met (if any) is raised. A
    `path` that does not exist is nothing to do.
    """
    try:
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        errors = _remove_entry(parent, path.name)
    finally:
        os.close(parent)
    if errors:
        raise errors[0]


def remove_tree_quietly(path: Path) -> None:
    """remove_tree on a failure path: what cannot go now is swept at the next start."""
    try:
        remove_tree(path)
    except OSError:
        pass


def _remove_entry(parent: int, name: str) -> list[OSError]:
    """Remove `name` in the directory open at `parent`, with all below it; return the errors."""
    errors: list[OSError] = []
    try:
        if not stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
            os.unlink(name, dir_fd=parent)
            return errors
        top = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return errors
    except OSError as exc:
        return [exc]
    _empty(top, errors)
    _rmdir(parent, name, errors)
    return errors


def _empty(top: int, errors: list[OSError]) -> None:
    """Remove everything below the directory open at `top`, depth first; closes `top`."""
    fd = top
    try:
        levels = [_enter(fd, "", errors)]
        device = levels[0].identity[0]
        while levels:
            level = levels[-1]
            if level.subdirs:
                child = _open_subdir(fd, level.subdirs.pop(), device, errors)
                if child is not None:
                    os.close(fd)
                    fd, name = child
                    levels.append(_enter(fd, name, errors))
                continue
            levels.pop()
            if levels:
                fd = _climb(fd, levels[-1].identity)
                _rmdir(fd, level.name, errors)
    except OSError as exc:  # lost the way back up: stop rather than guess
        errors.append(exc)
    finally:
        os.close(fd)


def _enter(fd: int, name: str, errors: list[OSError]) -> _Level:
    """Unlink every non-directory in the directory open at `fd`; list its subdirectories."""
    st = os.fstat(fd)
    level = _Level(name, (st.st_dev, st.st_ino))
    try:
        if st.st_mode & _OWNER_RWX != _OWNER_RWX:  # its entries cannot go otherwise
            os.fchmod(fd, stat.S_IMODE(st.st_mode) | _OWNER_RWX)
        with os.scandir(fd) as listing:
            entries = list(listing)
    except OSError as exc:
        errors.append(exc)
        return level
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                level.subdirs.append(entry.name)
            else:
                os.unlink(entry.name, dir_fd=fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            errors.append(exc)
    return level


def _open_subdir(
    fd: int, name: str, device: int, errors: list[OSError]
) -> tuple[int, str] | None:
    """The subdirectory `name` of `fd`, opened without following a link; None to skip it."""
    try:
        child = os.open(name, _DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        errors.append(exc)
        return None
    if os.fstat(child).st_dev != device:
        os.close(child)
        errors.append(OSError(errno.EXDEV, f"mount point {name!r} inside the tree not entered"))
        return None
    return child, name


def _climb(fd: int, expected: Identity) -> int:
    """The parent of the directory open at `fd` (closed), if it is still `expected`."""
    parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
    st = os.fstat(parent)
    if (st.st_dev, st.st_ino) != expected:
        os.close(parent)
        raise OSError(errno.ESTALE, "a directory moved while its tree was being removed")
    os.close(fd)
    return parent


def _rmdir(fd: int, name: str, errors: list[OSError]) -> None:
    try:
        os.rmdir(name, dir_fd=fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        errors.append(exc)
