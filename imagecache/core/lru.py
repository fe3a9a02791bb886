"""Byte-budget LRU: which layer blobs to evict so the cache fits its budget.

Pure: given every present layer's size and last-used tick, the pinned set and
the budget, return digests to delete, least recently used first. Pinned
layers are never chosen, even when the budget cannot be met without them;
eviction stops as soon as the total is at or under the budget.
Ties on the tick break by digest so the choice is deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass


@dataclass(frozen=True)
class LayerUse:
    size: int  # bytes on disk
    last_used: int  # monotonically increasing tick; larger = more recent


def choose_evictions(
    layers: Mapping[str, LayerUse], pinned: Set[str], budget_bytes: int
) -> list[str]:
    """Digests to evict, in order, so that the remaining total is <= budget_bytes if possible."""
    total = sum(use.size for use in layers.values())
    victims: list[str] = []
    candidates = sorted(
        (use.last_used, digest) for digest, use in layers.items() if digest not in pinned
    )
    for _, digest in candidates:
        if total <= budget_bytes:
            break
        victims.append(digest)
        total -= layers[digest].size
    return victims
