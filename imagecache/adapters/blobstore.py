"""Content-addressed blob files: `<root>/sha256/<hex>`, written only when verified.

A blob is streamed into a temp file in the same directory (name starts with
`.tmp-`, never 64 hex digits), hashed and counted on the way; it is renamed to
its digest name only after size and sha256 match and the data is fsynced.
A kill at any point leaves at most a temp file, which `sweep_temp` removes.
No more than the declared size is ever written (the caller has made room for
exactly that); a `check_room` callback is asked again every CHECK_EVERY
bytes, so a disk that others fill stops the download. OSErrors leave here as
ImageError (`no_space` for ENOSPC, else `io_error`).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import BinaryIO

from ground.durable import fsync_dir
from imagecache.errors import ImageError, os_failure

TEMP_PREFIX = ".tmp-"
_HEX = re.compile(r"[0-9a-f]{64}")
CHECK_EVERY = 1 << 20


def hex_of(digest: str) -> str:
    algorithm, _, hexpart = digest.partition(":")
    if algorithm != "sha256" or not _HEX.fullmatch(hexpart):
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

    async def write(
        self,
        digest: str,
        size: int,
        chunks: AsyncIterator[bytes],
        check_room: Callable[[], None] | None = None,
    ) -> None:
        """Stream `chunks` into blob `digest`; on any failure raise ImageError, leave nothing.

        `check_room` raises ImageError when the disk can no longer take the rest.
        """
        final = self.path(digest)
        temp = self.dir / f"{TEMP_PREFIX}{final.name}-{secrets.token_hex(4)}"
        committed = False
        try:
            # Creating a file costs ~0.2 ms (ext4, measured): in a thread, so a
            # pull of thousands of layers does not stall the loop.
            with await asyncio.to_thread(open, temp, "xb") as out:
                await copy_verified(digest, size, chunks, out, check_room)
                await asyncio.to_thread(_commit, out, temp, final)
                committed = True
        except OSError as exc:
            raise os_failure(exc, f"writing blob {digest}") from None
        finally:
            if not committed:
                _unlink_quietly(temp)


async def _close(chunks: AsyncIterator[bytes]) -> None:
    """Close the source now (its HTTP response with it), not whenever it is collected."""
    close = getattr(chunks, "aclose", None)
    if close is not None:
        await close()


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass  # swept when the cache next starts


def _commit(out: BinaryIO, temp: Path, final: Path) -> None:
    out.flush()
    os.fsync(out.fileno())
    os.rename(temp, final)
    fsync_dir(final.parent)


async def copy_verified(
    digest: str,
    size: int,
    chunks: AsyncIterator[bytes],
    out: BinaryIO,
    check_room: Callable[[], None] | None = None,
) -> None:
    """Copy `chunks` to `out`, failing as soon as they exceed `size`; then check size and hash.

    `check_room` (if any) is called with the first chunk and every CHECK_EVERY
    bytes after. `chunks` is closed on the way out (an HTTP response with it).
    """
    hasher = hashlib.sha256()
    count = 0
    checked = -CHECK_EVERY
    try:
        async for chunk in chunks:
            count += len(chunk)
            if count > size:
                raise ImageError(
                    "size_mismatch", f"blob {digest}: more than the {size} bytes declared"
                )
            if check_room is not None and count - checked >= CHECK_EVERY:
                check_room()
                checked = count
            hasher.update(chunk)
            out.write(chunk)
    finally:
        await _close(chunks)
    if count != size:
        raise ImageError("size_mismatch", f"blob {digest}: truncated, got {count} of {size} bytes")
    actual = "sha256:" + hasher.hexdigest()
    if actual != digest:
        raise ImageError("digest_mismatch", f"blob {digest}: content hashes to {actual}")
