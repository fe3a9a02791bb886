"""The image a build starts FROM: `scratch`, `builtin:NAME`, `oci:PATH[:TAG]` or a registry
reference `HOST[:PORT]/NAME[:TAG]`.

Manifests, configs and blobs are fetched by the image cache's own sources
(imagecache/resolver.py), so there is one registry client and one layout reader,
each blob verified against its digest. The registry or layout the build names
is allowed by naming it (a registry at a loopback address is spoken to over
http, any other over https). A base is held in memory with its layers' bytes,
which a build reuses byte for byte (same digests) under its own layers.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import os
import posixpath
import tarfile
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from imagecache.adapters.blobstore import copy_verified
from imagecache.adapters.sources import read_config
from imagecache.core.egress import EgressPolicy
from imagecache.core.manifest import GZIP_LAYERS
from imagecache.core.reference import LayoutRef, parse_reference
from imagecache.errors import ImageError
from imagecache.resolver import ImageResolver
from thaw.baseimage import base_layout, is_builtin
from thaw.ociimage import Blob

SCRATCH = "scratch"
_MAX_BASE_BYTES = 2 << 30  # a base is held in memory: refuse one that cannot be
_T = TypeVar("_T")


@dataclass(frozen=True)
class BaseImage:
    ref: str
    layers: list[Blob] = field(default_factory=list)  # compressed, as the base has them
    config_doc: dict[str, Any] = field(default_factory=dict)

    @property
    def diff_ids(self) -> list[str]:
        rootfs = self.config_doc.get("rootfs") or {}
        return [str(d) for d in rootfs.get("diff_ids") or []]

    @property
    def run_config(self) -> dict[str, Any]:
        config = self.config_doc.get("config")
        return config if isinstance(config, dict) else {}


def load_base(ref: str) -> BaseImage:
    """The base image `ref` names; ValueError (with the reason) when it cannot be had."""
    if ref == SCRATCH:
        return BaseImage(SCRATCH)
    source_ref = ref
    if is_builtin(ref):
        path, tag = base_layout(ref)
        source_ref = f"oci:{path}:{tag}"
    try:
        parsed = parse_reference(source_ref)
        if isinstance(parsed, LayoutRef):
            policy = EgressPolicy.build(layout_dirs=[os.path.realpath(parsed.path)])
        else:
            policy = EgressPolicy.build([parsed.host])
        layers, config = _blocking(_fetch(ImageResolver(policy), source_ref))
    except ImageError as exc:
        raise ValueError(f"FROM {ref}: {exc.message}") from None
    base = BaseImage(ref, layers, config)
    if len(base.diff_ids) != len(layers):
        raise ValueError(f"FROM {ref}: its config lists {len(base.diff_ids)} diff_ids "
                         f"for {len(layers)} layers")
    return base


def _blocking(work: Coroutine[Any, Any, _T]) -> _T:
    """Run `work` to its end from synchronous code, even code an event loop called (a
    test, or `thaw up`'s own loop): then on a loop of its own in another thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result()


async def _fetch(resolver: ImageResolver, ref: str) -> tuple[list[Blob], dict[str, Any]]:
    try:
        source = resolver.source(parse_reference(ref))
        resolved = await resolver.resolve_within(source, ref)
        config = json.loads(await read_config(source, resolved.manifest.config))
        total = sum(layer.size for layer in resolved.manifest.layers)
        if total > _MAX_BASE_BYTES:
            raise ImageError("unsupported", f"layers of {total} bytes: too large a base")
        layers: list[Blob] = []
        for layer in resolved.manifest.layers:
            buffer = io.BytesIO()
            await copy_verified(layer.digest, layer.size, source.blob(layer.digest), buffer)
            layers.append(Blob(layer.media_type, buffer.getvalue()))
        return layers, config if isinstance(config, dict) else {}
    finally:
        await resolver.close()


def file_in_image(base: BaseImage, path: str) -> bytes | None:
    """The content of regular file `path` ("etc/passwd") in the base's top layer that has
    it, or None. Reads whole layers: for the few small files a build looks up."""
    wanted = posixpath.normpath(path).lstrip("/")
    for layer in reversed(base.layers):
        raw = gzip.decompress(layer.data) if layer.media_type in GZIP_LAYERS else layer.data
        with tarfile.open(fileobj=io.BytesIO(raw)) as archive:
            for member in archive:
                if posixpath.normpath("/" + member.name).lstrip("/") != wanted:
                    continue
                handle = archive.extractfile(member) if member.isfile() else None
                return handle.read() if handle is not None else None
    return None
