"""Rebuild an image cache's state from its directories, dropping whatever is unfinished.

Complete images are those whose record names only blobs that are present and
whose rootfs tree exists. Temp files and trees (`.tmp-…`), records of
incomplete images, aliases of nothing and rootfs trees no record names are
deleted. An image recorded without its usage (a cache from before usage was
kept) has its tree measured and its links checked (`inspect_rootfs`), and is
dropped if a link leaves the root. Blocking IO: runs when the cache starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from imagecache.adapters.blobstore import BlobStore, hex_of
from imagecache.adapters.records import ImageRecords, StoredImage
from imagecache.adapters.rootfs import inspect_rootfs
from imagecache.adapters.trees import remove_tree
from imagecache.api import Image
from imagecache.core.tarsafety import UnpackLimits
from imagecache.errors import ImageError


@dataclass
class RecoveredState:
    sizes: dict[str, int] = field(default_factory=dict)  # layer digest -> blob bytes
    images: dict[str, Image] = field(default_factory=dict)
    rootfs_bytes: dict[str, int] = field(default_factory=dict)  # image digest -> charged
    aliases: dict[str, str] = field(default_factory=dict)  # alias digest -> image digest
    by_age: list[tuple[bool, str]] = field(default_factory=list)  # (is image, digest), oldest first


def recover(
    store: BlobStore, records: ImageRecords, rootfs_dir: Path, limits: UnpackLimits
) -> RecoveredState:
    state = RecoveredState()
    rootfs_dir.mkdir(parents=True, exist_ok=True)
    store.sweep_temp()
    records.sweep_temp()
    uses: list[tuple[float, int, str]] = []  # (mtime, images before layers, digest)
    for digest, (size, mtime) in store.present().items():
        state.sizes[digest] = size
        uses.append((mtime, 1, digest))
    for stored in records.load():
        usage = _usage(stored, state.sizes, rootfs_dir, records, limits)
        if usage is None:
            records.delete(stored.image.digest, [])
            continue
        state.images[stored.image.digest] = stored.image
        state.rootfs_bytes[stored.image.digest] = usage
        uses.append((stored.last_used, 0, stored.image.digest))
    state.by_age = [(kind == 0, digest) for _, kind, digest in sorted(uses)]
    for alias, target in records.load_aliases().items():
        if target in state.images:
            state.aliases[alias] = target
        else:
            records.delete_alias(alias)
    known = {hex_of(digest) for digest in state.images}
    for entry in rootfs_dir.iterdir():
        if entry.name not in known:  # temp trees, and trees no record names
            remove_tree(entry)
    return state


def _usage(
    stored: StoredImage,
    sizes: dict[str, int],
    rootfs_dir: Path,
    records: ImageRecords,
    limits: UnpackLimits,
) -> int | None:
    """The charged rootfs bytes of a complete image, else None (the image is dropped)."""
    image = stored.image
    rootfs = rootfs_dir / hex_of(image.digest)
    if not all(layer.digest in sizes for layer in image.layers) or not rootfs.is_dir():
        return None
    if stored.usage_bytes is not None:
        return stored.usage_bytes
    try:
        usage = inspect_rootfs(rootfs, limits)
    except ImageError:
        return None
    records.save_usage(image.digest, usage)
    return usage
