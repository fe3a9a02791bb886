"""OCI image-layout directories as an image source (`oci-layout`, `index.json`, `blobs/`).

Every file is opened by its resolved path, and only after `refusal` (the egress
policy's layout rule) has passed that path: a symlink inside a layout cannot
lead a read outside the allowed layout directories.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from imagecache.adapters.blobstore import hex_of
from imagecache.core.manifest import sha256_digest
from imagecache.errors import ImageError

_CHUNK = 1 << 16
_MAX_DOC_BYTES = 4 * 1024 * 1024


# resolved path -> None when it may be read, else why not
PathRefusal = Callable[[str], str | None]


class LayoutSource:
    def __init__(self, path: Path, refusal: PathRefusal, shown: str) -> None:
        """`path`: the layout's resolved directory; `shown`: the path as the owner wrote it."""
        self.path = path
        self._refusal = refusal
        self._shown = shown
        if not (path / "oci-layout").is_file() or not (path / "index.json").is_file():
            raise ImageError("not_found", f"{shown} is not an OCI image layout")

    def index(self) -> bytes:
        return self._read_small(self.path / "index.json", "index.json")

    def document(self, digest: str) -> bytes:
        """A manifest or index blob, verified against `digest`."""
        body = self._read_small(self._blob_path(digest), f"blob {digest}")
        if sha256_digest(body) != digest:
            raise ImageError("digest_mismatch", f"layout blob {digest} does not match its content")
        return body

    async def blob(self, digest: str) -> AsyncIterator[bytes]:
        """Stream a blob's bytes from the layout; the caller verifies them."""
        path = self._checked(self._blob_path(digest), f"blob {digest}")
        try:
            handle = await asyncio.to_thread(open, path, "rb")
        except FileNotFoundError:
            raise ImageError("not_found", f"layout blob {digest} missing") from None
        try:
            while chunk := await asyncio.to_thread(handle.read, _CHUNK):
                yield chunk
        finally:
            handle.close()

    def _blob_path(self, digest: str) -> Path:
        return self.path / "blobs" / "sha256" / hex_of(digest)

    def _checked(self, path: Path, what: str) -> str:
        real = os.path.realpath(path)
        if self._refusal(real) is not None:
            raise ImageError(
                "forbidden_host", f"layout {self._shown}: {what} is outside the allowed directories"
            )
        return real

    def _read_small(self, path: Path, what: str) -> bytes:
        try:
            with open(self._checked(path, what), "rb") as handle:
                body = handle.read(_MAX_DOC_BYTES + 1)
        except FileNotFoundError:
            raise ImageError("not_found", f"layout {self._shown}: {what} missing") from None
        if len(body) > _MAX_DOC_BYTES:
            raise ImageError("registry_error", f"layout {self._shown}: {what} too large")
        return body
