"""Removing directory trees on a real file system: iteratively, never through a link."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagecache.adapters.trees import remove_tree, remove_tree_quietly

pytestmark = pytest.mark.integration

NOBODY = 65534


def _nest(top: Path, depth: int, name: str) -> None:
    """`depth` directories `name/name/…` under `top`, a file at the bottom, made via dir fds
    (their paths outgrow PATH_MAX)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


def test_a_tree_1500_directories_deep_is_removed_though_its_paths_outgrow_path_max(
    tmp_path: Path,
) -> None:
    top = tmp_path / "deep"
    top.mkdir()
    depth = 1500
    assert depth > sys.getrecursionlimit()  # a recursive walk could not get to the bottom
    _nest(top, depth, "level")  # 6 bytes a level: 9000 bytes of path
    remove_tree(top)
    assert os.listdir(tmp_path) == []


def test_symlinks_inside_a_tree_are_removed_and_their_targets_survive(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "dir" / "keep").write_bytes(b"k")
    (outside / "file").write_bytes(b"f")
    top = tmp_path / "tree"
    (top / "a" / "b").mkdir(parents=True)
    os.symlink(outside / "dir", top / "a" / "to_dir")
    os.symlink(outside / "file", top / "a" / "b" / "to_file")
    os.symlink("../../../outside", top / "a" / "b" / "relative")
    remove_tree(top)
    assert not top.exists()
    assert (outside / "dir" / "keep").read_bytes() == b"k"
    assert (outside / "file").read_bytes() == b"f"


def test_a_symlink_given_as_the_tree_is_removed_itself_and_its_target_survives(
    tmp_path: Path,
) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_bytes(b"k")
    os.symlink(target, tmp_path / "link")
    remove_tree(tmp_path / "link")
    assert not os.path.lexists(tmp_path / "link")
    assert (target / "keep").read_bytes() == b"k"


def test_a_file_or_a_missing_path_is_removed_or_nothing_to_do(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    remove_tree(tmp_path / "file")
    remove_tree(tmp_path / "missing")
    remove_tree(tmp_path / "missing" / "below")
    assert os.listdir(tmp_path) == []


def test_directories_without_owner_permissions_are_opened_up_and_removed(tmp_path: Path) -> None:
    top = tmp_path / "tree"
    (top / "locked" / "inner").mkdir(parents=True)
    (top / "locked" / "inner" / "f").write_bytes(b"x")
    os.chmod(top / "locked" / "inner", 0o500)
    os.chmod(top / "locked", 0o500)
    remove_tree(top)
    assert not top.exists()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can reach (pytest's own are private to the user)."""
    path = Path(tempfile.mkdtemp(prefix="thaw-trees-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make an entry another user owns")
def test_an_entry_that_cannot_go_leaves_only_itself_and_its_ancestors_and_is_raised(
    shared_dir: Path,
) -> None:
    top = shared_dir / "tree"
    for rel in ("a/stuck", "b/c/d", "z"):
        (top / rel).mkdir(parents=True)
        (top / rel / "f").write_bytes(b"x")
    (top / "file").write_bytes(b"x")
    for path in [top, *top.rglob("*")]:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    os.chown(top / "a" / "stuck", 0, 0)  # nobody may neither empty nor open it up
    os.setegid(NOBODY)
    os.seteuid(NOBODY)
    try:
        with pytest.raises(PermissionError) as caught:
            remove_tree(top)
        remove_tree_quietly(top)
    finally:
        os.seteuid(0)
        os.setegid(0)
    assert caught.value.filename == "f"  # the first failure: stuck/f, not the ENOTEMPTY after it
    left = sorted(str(p.relative_to(top)) for p in top.rglob("*"))
    assert left == ["a", "a/stuck", "a/stuck/f"]
