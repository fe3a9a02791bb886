"""The market: which workers may take a machine, and in which order to offer it.

Decides, from worker heartbeats and the image's layer list, a ranked list of
workers with a per-term score breakdown, and the reason for every worker it
filtered out. Invariants: placement is region-strict (a worker outside the
requested region is never ranked); every score term is in [0, 1] and the total
is their weighted mean, so it is in [0, 1] too; a worker that is ranked fits the
guest after every reservation it already carries; above `candidate_threshold`
workers only a candidate set is filtered and scored, so the cost of a decision
does not grow with the fleet. "No capacity" is an empty ranking, not an error.
It must not know about HTTP, the registry, clocks or random sources: `now` and
the sampler are arguments.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import NamedTuple, Protocol, TypeVar

from thaw.registry.types import WorkerStatus

T = TypeVar("T")

UtilityPoints = tuple[tuple[float, float], ...]
DEFAULT_UTILITY: UtilityPoints = ((0.0, 0.3), (0.7, 1.0), (0.9, 0.5), (1.0, 0.0))


class Sampler(Protocol):
    """A random source: `random.Random` is one."""

    def sample(self, population: Sequence[T], k: int) -> list[T]: ...


@dataclass(frozen=True)
class MarketParams:
    """Tunables of the market. Times in seconds, bandwidth in bytes per second."""

    heartbeat_freshness_s: float = 3.0
    reference_bandwidth_bytes_per_s: float = 100e6
    reference_pull_time_s: float = 2.0
    utility_points: UtilityPoints = DEFAULT_UTILITY
    candidate_threshold: int = 128
    candidate_top_holders: int = 32


@dataclass(frozen=True)
class PlacementRequest:
    """One machine to place. `image_layers` maps layer digest -> compressed bytes."""

    app: str
    region: str
    cpus: float
    memory_mb: int
    image_layers: Mapping[str, int] = field(default_factory=dict)
    declined: frozenset[str] = frozenset()  # workers that declined in this wake


@dataclass(frozen=True)
class Market:
    """What the scoring functions may look at besides the worker itself."""

    request: PlacementRequest
    params: MarketParams
    now: float
    app_machines: Mapping[str, int]  # worker id -> machines of this app on it


class Term(NamedTuple):
    name: str
    fn: Callable[[WorkerStatus, Market], float]
    weight: float


class Filter(NamedTuple):
    name: str
    fn: Callable[[WorkerStatus, Market], str | None]  # a reason to reject, or None


@dataclass(frozen=True)
class Scored:
    worker: str
    url: str
    score: float
    terms: dict[str, float]


@dataclass(frozen=True)
class Filtered:
    worker: str
    stage: str
    reason: str


@dataclass(frozen=True)
class Decision:
    """The market's answer: `ranked` best first; empty means no capacity."""

    app: str
    region: str
    ranked: tuple[Scored, ...]
    filtered: tuple[Filtered, ...]
    fleet: int  # workers known in the region
    considered: int  # workers filtered and scored (the candidate set above the threshold)

    @property
    def outcome(self) -> str:
        return "placed" if self.ranked else "no_capacity"


# -- score terms ----------------------------------------------------------------


def piecewise_linear(points: UtilityPoints, x: float) -> float:
    """Linear interpolation through `points` (sorted by x); clamped at both ends."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in pairwise(points):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return points[-1][1]


def utilisation_after(worker: WorkerStatus, request: PlacementRequest) -> float:
    """Max of the cpu and memory fractions reserved once the guest is placed, in [0, 1]."""
    cpu = (worker.reserved_cpus + request.cpus) / worker.cpus if worker.cpus > 0 else 1.0
    memory = (
        (worker.reserved_memory_mb + request.memory_mb) / worker.memory_mb
        if worker.memory_mb > 0
        else 1.0
    )
    return min(1.0, max(cpu, memory))


def resources_term(worker: WorkerStatus, market: Market) -> float:
    return piecewise_linear(
        market.params.utility_points, utilisation_after(worker, market.request)
    )


def missing_layer_bytes(worker: WorkerStatus, image_layers: Mapping[str, int]) -> int:
    """Bytes of this image's layers the worker would have to pull."""
    return sum(size for digest, size in image_layers.items() if digest not in worker.layers)


def layers_term(worker: WorkerStatus, market: Market) -> float:
    params = market.params
    budget = params.reference_bandwidth_bytes_per_s * params.reference_pull_time_s
    missing = missing_layer_bytes(worker, market.request.image_layers)
    return 1.0 - min(1.0, missing / budget) if budget > 0 else float(missing == 0)


def spread_term(worker: WorkerStatus, market: Market) -> float:
    return 1.0 / (1 + market.app_machines.get(worker.id, 0))


def starting_term(worker: WorkerStatus, market: Market) -> float:
    return 1.0 / (1 + max(0, worker.machines_starting))


TERMS: tuple[Term, ...] = (
    Term("resources", resources_term, 1.0),
    Term("layers", layers_term, 1.0),
    Term("spread", spread_term, 0.5),
    Term("starting", starting_term, 0.25),
)


# -- filters --------------------------------------------------------------------


def region_filter(worker: WorkerStatus, market: Market) -> str | None:
    if worker.region != market.request.region:
        return f"region {worker.region}, not {market.request.region}"
    return None


def healthy_filter(worker: WorkerStatus, market: Market) -> str | None:
    age = market.now - worker.updated_at
    if age > market.params.heartbeat_freshness_s:
        return f"stale heartbeat ({age:.1f}s old)"
    return None


def draining_filter(worker: WorkerStatus, market: Market) -> str | None:
    return "draining" if worker.draining else None


def disk_filter(worker: WorkerStatus, market: Market) -> str | None:
    return "disk full" if worker.disk_full else None


def fits_filter(worker: WorkerStatus, market: Market) -> str | None:
    request = market.request
    free_cpus = worker.cpus - worker.reserved_cpus
    free_memory = worker.memory_mb - worker.reserved_memory_mb
    if request.cpus > free_cpus + 1e-9:
        return f"insufficient cpus (needs {request.cpus:g}, free {max(free_cpus, 0):g})"
    if request.memory_mb > free_memory:
        return f"insufficient memory (needs {request.memory_mb} MB, free {max(free_memory, 0)} MB)"
    return None


def declined_filter(worker: WorkerStatus, market: Market) -> str | None:
    return "declined in this wake" if worker.id in market.request.declined else None


FILTERS: tuple[Filter, ...] = (
    Filter("region", region_filter),
    Filter("healthy", healthy_filter),
    Filter("draining", draining_filter),
    Filter("disk", disk_filter),
    Filter("fits", fits_filter),
    Filter("declined", declined_filter),
)


# -- the decision ---------------------------------------------------------------


def candidate_set(
    workers: Sequence[WorkerStatus],
    held_bytes: Mapping[str, int],
    params: MarketParams,
    sampler: Sampler,
) -> list[WorkerStatus]:
    """All workers up to the threshold; above it the top holders of the image's bytes
    (`held_bytes`: worker id -> bytes of this image it holds) plus ⌈log₂ N⌉ random others."""
    if len(workers) <= params.candidate_threshold:
        return list(workers)
    holders = sorted(
        (w for w in workers if held_bytes.get(w.id, 0) > 0),
        key=lambda w: (-held_bytes[w.id], w.id),
    )[: params.candidate_top_holders]
    chosen = {w.id for w in holders}
    others = [w for w in workers if w.id not in chosen]
    extra = min(len(others), math.ceil(math.log2(len(workers))))
    return holders + sampler.sample(others, extra)


def decide(
    request: PlacementRequest,
    workers: Sequence[WorkerStatus],
    *,
    now: float,
    params: MarketParams,
    app_machines: Mapping[str, int],
    held_bytes: Mapping[str, int],
    sampler: Sampler,
    terms: Sequence[Term] = TERMS,
    filters: Sequence[Filter] = FILTERS,
) -> Decision:
    """Filter, then score the candidates; ties go to the lower worker id (stable)."""
    market = Market(request, params, now, app_machines)
    candidates = candidate_set(workers, held_bytes, params, sampler)
    filtered: list[Filtered] = []
    ranked: list[Scored] = []
    for worker in candidates:
        rejection = first_rejection(worker, market, filters)
        if rejection is not None:
            filtered.append(rejection)
        else:
            ranked.append(score(worker, market, terms))
    ranked.sort(key=lambda s: (-s.score, s.worker))
    return Decision(
        app=request.app, region=request.region, ranked=tuple(ranked),
        filtered=tuple(filtered), fleet=len(workers), considered=len(candidates),
    )


def first_rejection(
    worker: WorkerStatus, market: Market, filters: Sequence[Filter]
) -> Filtered | None:
    for stage in filters:
        reason = stage.fn(worker, market)
        if reason is not None:
            return Filtered(worker.id, stage.name, reason)
    return None


def score(worker: WorkerStatus, market: Market, terms: Sequence[Term]) -> Scored:
    values = {term.name: min(1.0, max(0.0, term.fn(worker, market))) for term in terms}
    total_weight = sum(term.weight for term in terms)
    total = sum(term.weight * values[term.name] for term in terms)
    return Scored(
        worker=worker.id, url=worker.url,
        score=total / total_weight if total_weight > 0 else 0.0, terms=values,
    )
