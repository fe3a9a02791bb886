"""Byte-budget LRU: which unpacked images and layer blobs to evict so the cache fits.

Pure: given every present layer blob (size, last-used tick), every image
(its layers, the bytes its unpacked rootfs is charged, its tick), what is
protected and a target total, return what to delete, least recently used
first. Invariants: an image never outlives one of its layers, so evicting a
layer evicts every image that uses it, while evicting an image (its rootfs)
leaves its layers; a protected image protects its layers; protected things
are never chosen, even when the target cannot be met without them; eviction
stops as soon as the total is at or under the target. Ties on the tick break
images first (a rootfs can be rebuilt from blobs with no network), then by
digest, so the choice is deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass


@dataclass(frozen=True)
class LayerUse:
    size: int  # bytes of the blob on disk
    last_used: int  # monotonically increasing tick; larger = more recent


@dataclass(frozen=True)
class ImageUse:
    layers: frozenset[str]  # layer digests the image is built from
    rootfs_bytes: int  # what its unpacked rootfs is charged against the budget
    last_used: int


@dataclass(frozen=True)
class Evictions:
    images: list[str]  # image digests whose rootfs and record go, in order
    layers: list[str]  # layer digests whose blobs go, in order
    total_bytes: int  # what the cache holds afterwards


def total_bytes(layers: Mapping[str, LayerUse], images: Mapping[str, ImageUse]) -> int:
    """Blob bytes plus charged rootfs bytes."""
    return sum(u.size for u in layers.values()) + sum(u.rootfs_bytes for u in images.values())


def choose_evictions(
    layers: Mapping[str, LayerUse],
    images: Mapping[str, ImageUse],
    *,
    protected_layers: Set[str],
    protected_images: Set[str],
    target_bytes: int,
) -> Evictions:
    """What to delete, in order, so that the remaining total is <= target_bytes if possible.

    Protected layers are pulls in flight and anything the caller names; the
    layers of protected images are added here.
    """
    keep = set(protected_layers)
    for digest in protected_images & images.keys():
        keep |= images[digest].layers
    users: dict[str, list[str]] = {}
    for digest, use in sorted(images.items()):
        for layer in use.layers:
            users.setdefault(layer, []).append(digest)
    candidates = sorted(
        [(use.last_used, 0, d) for d, use in images.items() if d not in protected_images]
        + [(use.last_used, 1, d) for d, use in layers.items() if d not in keep]
    )
    total = total_bytes(layers, images)
    gone_images: dict[str, None] = {}  # ordered set
    gone_layers: list[str] = []
    for _, kind, digest in candidates:
        if total <= target_bytes:
            break
        for image in [digest] if kind == 0 else users.get(digest, []):
            if image not in gone_images:
                gone_images[image] = None
                total -= images[image].rootfs_bytes
        if kind == 1:
            gone_layers.append(digest)
            total -= layers[digest].size
    return Evictions(images=list(gone_images), layers=gone_layers, total_bytes=total)
