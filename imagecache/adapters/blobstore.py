"""Content-addressed blob files: `<root>/sha256/<hex>`, written only when verified.

A blob is streamed into a temp file in the same directory (name starts with
`.tmp-`, never 64 hex digits), hashed and counted on the way; it is renamed to
its digest name only after size and sha256 match and the data is fsynced.
A kill at any point leaves at most a temp file, which `sweep_temp` removes.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

from imagecache.errors import ImageError
from thaw.durable import fsync_dir

TEMP_PREFIX = ".tmp-"


def hex_of(digest: str) -> str:
    algorithm, _, hexpart = digest.partition(":")
    if algorithm != "sha256" or len(hexpart) != 64 or not all(
        c in "0123456789abcdef" for c in hexpart
    ):
        raise ImageError("bad_reference", f"unsupported digest {digest!r}")
    return hexpart


class BlobStore:
    def __init__(self, root: Path) -> None:
        self.dir = root / "sha256"
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> Path:
        return self.dir / hex_of(digest)

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def sweep_temp(self) -> None:
        """Remove temp files left by a crashed writer."""
        for entry in self.dir.iterdir():
            if entry.name.startswith(TEMP_PREFIX):
                entry.unlink(missing_ok=True)

    def present(self) -> dict[str, tuple[int, float]]:
        """digest -> (size, mtime) of every committed blob."""
        found: dict[str, tuple[int, float]] = {}
        for entry in self.dir.iterdir():
            if len(entry.name) == 64 and not entry.name.startswith("."):
                st = entry.stat()
                found["sha256:" + entry.name] = (st.st_size, st.st_mtime)
        return found

    def touch(self, digest: str) -> None:
        try:
            os.utime(self.path(digest))
        except FileNotFoundError:
            pass

    def delete(self, digest: str) -> None:
        self.path(digest).unlink(missing_ok=True)

    async def write(self, digest: str, size: int, chunks: AsyncIterator[bytes]) -> None:
        """Stream `chunks` into blob `digest`; on any mismatch raise ImageError, leave nothing."""
        final = self.path(digest)
        temp = self.dir / f"{TEMP_PREFIX}{hex_of(digest)}-{secrets.token_hex(4)}"
        try:
            # Opening a local file is not worth a thread hop; the fsyncs are.
            with open(temp, "xb") as out:  # noqa: ASYNC230
                await copy_verified(digest, size, chunks, out)
                await asyncio.to_thread(_commit, out, temp, final)
        finally:
            temp.unlink(missing_ok=True)


def _commit(out: BinaryIO, temp: Path, final: Path) -> None:
    out.flush()
    os.fsync(out.fileno())
    os.rename(temp, final)
    fsync_dir(final.parent)


async def copy_verified(
    digest: str, size: int, chunks: AsyncIterator[bytes], out: BinaryIO
) -> None:
    """Copy `chunks` to `out`, failing as soon as they exceed `size`; then check size and hash."""
    hasher = hashlib.sha256()
    count = 0
    async for chunk in chunks:
        count += len(chunk)
        if count > size:
            raise ImageError("size_mismatch", f"blob {digest}: more than the {size} bytes declared")
        hasher.update(chunk)
        out.write(chunk)
    if count != size:
        raise ImageError("size_mismatch", f"blob {digest}: truncated, got {count} of {size} bytes")
    actual = "sha256:" + hasher.hexdigest()
    if actual != digest:
        raise ImageError("digest_mismatch", f"blob {digest}: content hashes to {actual}")
