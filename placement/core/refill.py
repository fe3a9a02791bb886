"""After a registry loss: when placement may act on the registry's view again.

A lost registry (a new generation: Redis restarted empty, or flushed) is filled again
by placement (every stored app) and by each agent (its worker, layers and machines).
Until an agent has done so its worker is missing from the view, and with it every
machine it runs: a reconciler acting then sees "0 running" and creates a second
machine. So after a loss nothing is acted on until every worker that was live before
it has published everything under the new generation (its heartbeat names that
generation once its machines are out again), or until `bound_s` has passed: a worker
that died meanwhile never comes back, and its apps must not wait for it forever.

Invariants: a refill ends once and stays ended; a worker counts as back only under the
refill's own generation (a heartbeat from before the loss names the old one). It must
not know the registry, the clock or the reconciler: times and heartbeats are arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Refill:
    """A refill under way: the new `generation`, when the loss was seen (`began`,
    monotonic seconds), and the workers live before it (`awaited`)."""

    generation: str
    began: float
    awaited: frozenset[str]


def begin(generation: str, now: float, live_before: Iterable[str]) -> Refill:
    return Refill(generation, now, frozenset(live_before))


def still_awaited(refill: Refill, published: Mapping[str, str]) -> frozenset[str]:
    """The awaited workers that have not yet published everything under the refill's
    generation. `published`: worker id -> the generation its heartbeat names."""
    return frozenset(w for w in refill.awaited if published.get(w) != refill.generation)


def over(refill: Refill, published: Mapping[str, str], now: float, bound_s: float) -> bool:
    """Whether the view may be acted on again: every awaited worker is back, or
    `bound_s` seconds have passed since the loss was seen."""
    return now >= refill.began + bound_s or not still_awaited(refill, published)
