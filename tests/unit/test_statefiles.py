"""State files (ground/statefiles.py): 0600 files in 0700 dirs, and nothing else touched."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ground.statefiles import make_dirs, open_private, private_dir, tighten, write_private


def mode(path: Path | str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_private_file_is_0600_whatever_it_was_and_its_dirs_0700(tmp_path: Path) -> None:
    state = private_dir(tmp_path / "a" / "b")
    assert mode(tmp_path / "a") == 0o700 and mode(state) == 0o700
    loose = state / "log"
    loose.write_text("x")
    os.chmod(loose, 0o644)
    os.close(open_private(loose))
    write_private(state / "config.json", b"{}")
    assert mode(loose) == 0o600 and mode(state / "config.json") == 0o600


def test_opening_or_tightening_dev_null_leaves_it_open_to_everyone() -> None:
    """The process driver sends a probe's output to /dev/null through open_private; made
    0600 it broke every container's init on the host (runc reopens it as the app's user)."""
    before = mode(os.devnull)
    os.close(open_private(Path(os.devnull), os.O_WRONLY | os.O_APPEND))
    tighten(Path(os.devnull))
    assert mode(os.devnull) == before == 0o666


def test_tighten_skips_missing_files_and_never_follows_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("x")
    os.chmod(target, 0o644)
    (tmp_path / "db-wal").symlink_to(target)
    tighten(tmp_path / "db-wal", tmp_path / "db-shm")
    assert mode(target) == 0o644


def test_made_dirs_take_the_mode_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        make_dirs(tmp_path / "x" / "y", 0o711)
    finally:
        os.umask(old)
    assert mode(tmp_path / "x") == 0o711 and mode(tmp_path / "x" / "y") == 0o711
