"""A small disk for a test: a tmpfs of a given size, mounted for the test and unmounted
after it (needs root; tests/unit/test_oplog_file.py stands in a full disk for the op
log's rules without one)."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """`where` (made here) with a tmpfs of `size` (mount's syntax: "4m") on it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                   check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Fill the file system under `disk` with one file, in MiB and then in pages, until
    no more fits: the file."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as out:
        for chunk in (1 << 20, 4096):
            try:
                while True:
                    out.write(bytes(chunk))
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    return filler
