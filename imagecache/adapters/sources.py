"""Where images come from: a registry or a layout dir, behind one small interface.

`resolve` turns a reference into the platform manifest (following an index or
manifest list to linux/amd64), verifying every document against the digest
that named it; `blob` streams any blob by digest for the blob store to verify.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from imagecache.adapters.blobstore import copy_verified
from imagecache.adapters.layout import LayoutSource, PathRefusal
from imagecache.adapters.registry import RegistryClient
from imagecache.core.manifest import (
    INDEX_TYPES,
    Descriptor,
    Manifest,
    load_json,
    media_type_of,
    parse_manifest,
    select_platform,
    select_tag,
)
from imagecache.core.reference import LayoutRef, RegistryRef
from imagecache.errors import ImageError

_MAX_CONFIG_BYTES = 4 * 1024 * 1024

# digest (or tag) -> (body, content type, sha256 of body)
FetchDocument = Callable[[str], Awaitable[tuple[bytes, str, str]]]


@dataclass(frozen=True)
class Resolved:
    digest: str  # of the platform manifest: the image's identity
    manifest: Manifest
    aliases: list[str]  # other digests naming this image (the index it came through)


class ImageSource(Protocol):
    async def resolve(self) -> Resolved: ...

    def blob(self, digest: str) -> AsyncIterator[bytes]: ...


async def read_config(source: ImageSource, config: Descriptor) -> bytes:
    """The config blob, in memory, verified against its descriptor."""
    if config.size > _MAX_CONFIG_BYTES:
        raise ImageError("registry_error", f"config {config.digest} is {config.size} bytes")
    buffer = io.BytesIO()
    await copy_verified(config.digest, config.size, source.blob(config.digest), buffer)
    return buffer.getvalue()


async def descend(fetch: FetchDocument, first: str, expect: str | None) -> Resolved:
    """Fetch `first`, follow an index to linux/amd64, parse the image manifest."""
    body, content_type, digest = await fetch(first)
    if expect is not None and digest != expect:
        raise ImageError("digest_mismatch", f"manifest {expect} hashes to {digest}")
    doc = load_json(body, f"manifest {first}")
    aliases: list[str] = []
    if media_type_of(doc, content_type) in INDEX_TYPES:
        entry = select_platform(doc)
        aliases.append(digest)
        body, content_type, digest = await fetch(entry.digest)
        if digest != entry.digest:
            raise ImageError("digest_mismatch", f"manifest {entry.digest} hashes to {digest}")
        doc = load_json(body, f"manifest {entry.digest}")
        if media_type_of(doc, content_type) in INDEX_TYPES:
            raise ImageError("unsupported", f"nested index at {entry.digest}")
    return Resolved(digest=digest, manifest=parse_manifest(doc), aliases=aliases)


class RegistryImageSource:
    def __init__(self, client: RegistryClient, ref: RegistryRef) -> None:
        self._client = client
        self._ref = ref

    async def resolve(self) -> Resolved:
        async def fetch(reference: str) -> tuple[bytes, str, str]:
            return await self._client.manifest(self._ref, reference)

        return await descend(fetch, self._ref.reference, self._ref.digest)

    def blob(self, digest: str) -> AsyncIterator[bytes]:
        return self._client.blob(self._ref, digest)


class LayoutImageSource:
    def __init__(self, ref: LayoutRef, real_path: Path, refusal: PathRefusal) -> None:
        """`real_path`: `ref.path` resolved, already allowed by `refusal` (the layout rule)."""
        self._layout = LayoutSource(real_path, refusal, ref.path)
        self._tag = ref.tag

    async def resolve(self) -> Resolved:
        index = load_json(self._layout.index(), "layout index.json")
        entry = select_tag(index, self._tag)

        async def fetch(digest: str) -> tuple[bytes, str, str]:
            return self._layout.document(digest), "", digest

        return await descend(fetch, entry.digest, entry.digest)

    def blob(self, digest: str) -> AsyncIterator[bytes]:
        return self._layout.blob(digest)
