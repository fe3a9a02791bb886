"""The market: which workers may take a machine, and in which order to offer it.

Decides, from worker heartbeats (plus placement's own reservations not yet in
them) and the image's layer list, a ranked list of workers with a per-term score
breakdown, and the reason for every worker it filtered out. Invariants:
placement is region-strict (a worker outside the requested region is never
ranked); every term is in [0, 1]; the score is the `resources` gate times the
weighted mean of the other terms, so it is in [0, 1] too; a worker the guest
would push past `hot_utilisation` is ranked after every worker it would not,
whatever its layers (cache-aware, never a hot spot where a cooler worker fits);
a worker that is ranked fits the guest after every reservation it carries;
above `candidate_threshold` workers only a candidate set drawn from the region's
index is filtered and scored, so a decision touches O(k) workers, however large
the fleet. "No capacity" is an empty ranking, not an error. It must not know
about HTTP, the registry, clocks or random sources: `now` and the sampler are
arguments.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ground.registry.types import WorkerStatus
from placement.core.index import Draw, RegionIndex, ReservationLedger

UtilityPoints = tuple[tuple[float, float], ...]
# The `resources` gate: flat up to 85 % (a mild pull towards 70 %, so that full workers
# free whole ones), then falling fast: at 90 % a worker that holds the image wins over a
# cooler one only if that one would pull about half a reference pull more.
DEFAULT_UTILITY: UtilityPoints = ((0.0, 0.85), (0.7, 1.0), (0.85, 1.0), (0.9, 0.5),
                                  (1.0, 0.1))

Sampler = Draw  # `random.Random` is one


@dataclass(frozen=True)
class MarketParams:
    """Tunables of the market. Times in seconds, bandwidth in bytes per second,
    utilisation as a fraction of a worker's cpus or memory, in [0, 1]."""

    heartbeat_freshness_s: float = 3.0
    reference_bandwidth_bytes_per_s: float = 100e6
    reference_pull_time_s: float = 2.0
    utility_points: UtilityPoints = DEFAULT_UTILITY
    hot_utilisation: float = 0.9
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
    """What the scoring functions may look at besides the worker itself; `layers` and
    `pull_budget_bytes` are worked out once per decision from the request and params."""

    request: PlacementRequest
    params: MarketParams
    now: float
    app_machines: Mapping[str, int]  # worker id -> machines of this app on it
    layers: tuple[tuple[str, int], ...] = ()
    pull_budget_bytes: float = 0.0

    @classmethod
    def of(cls, request: PlacementRequest, params: MarketParams, now: float,
           app_machines: Mapping[str, int]) -> Market:
        budget = params.reference_bandwidth_bytes_per_s * params.reference_pull_time_s
        return cls(request, params, now, app_machines, tuple(request.image_layers.items()),
                   budget)


class Term(NamedTuple):
    name: str
    fn: Callable[[WorkerStatus, Market], float]
    weight: float  # in the weighted mean; a gate's weight is not used (it multiplies)


class Filter(NamedTuple):
    name: str
    fn: Callable[[WorkerStatus, Market], str | None]  # a reason to reject, or None


class Scored(NamedTuple):
    """One ranked worker (a tuple: made for every candidate, it must be cheap)."""

    worker: str
    url: str
    score: float
    terms: dict[str, float]
    hot: bool = False  # the guest would push it past `hot_utilisation`


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
    x0, y0 = points[0]
    if x <= x0:
        return y0
    for x1, y1 in points:
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
        x0, y0 = x1, y1
    return y0


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
    held = worker.layers
    missing = sum(size for digest, size in market.layers if digest not in held)
    budget = market.pull_budget_bytes
    return 1.0 - min(1.0, missing / budget) if budget > 0 else float(missing == 0)


def spread_term(worker: WorkerStatus, market: Market) -> float:
    return 1.0 / (1 + market.app_machines.get(worker.id, 0))


def starting_term(worker: WorkerStatus, market: Market) -> float:
    """A gate: 1 / (1 + starts in flight per core, at least one core). Boots share the
    worker's CPUs (a worker of 8 cores starting 8 is as busy as one of 1 starting 1).
    As a term of the mean, weight 0.25, it flattened so fast (1/21 against 1/81 starts)
    that the resources gate's pull towards fuller workers won: a herd of 150 cold apps
    on 3 equal workers went 100 / 28 / 22. As a gate, twice the starts per core ranks
    a worker about half as well, whatever else."""
    return 1.0 / (1 + max(0, worker.machines_starting) / max(1.0, worker.cpus))


GATES: tuple[Term, ...] = (Term("resources", resources_term, 1.0),
                           Term("starting", starting_term, 1.0))
TERMS: tuple[Term, ...] = (
    Term("layers", layers_term, 1.0),
    Term("spread", spread_term, 0.5),
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


def pull_filter(worker: WorkerStatus, market: Market) -> str | None:
    """A worker that cannot pull takes only machines whose image's layers it holds (an
    image whose layers are not known is one it would pull)."""
    if not worker.pull_blocked or not _must_pull(worker, market):
        return None
    return f"cannot pull: {worker.pull_blocked}"


def _must_pull(worker: WorkerStatus, market: Market) -> bool:
    held = worker.layers
    return not market.layers or any(digest not in held for digest, _ in market.layers)


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
    Filter("pull", pull_filter),
    Filter("fits", fits_filter),
    Filter("declined", declined_filter),
)


# -- the decision ---------------------------------------------------------------


def candidate_set(
    index: RegionIndex, request: PlacementRequest, params: MarketParams, sampler: Sampler,
    now: float,
) -> list[WorkerStatus]:
    """All workers up to the threshold; above it the top holders of the image's bytes
    plus ⌈log₂ N⌉ random others with room for the guest (by their heartbeat)."""
    if len(index) <= params.candidate_threshold:
        return list(index.workers.values())
    holders = index.top_holders(request.image_layers, params.candidate_top_holders)
    chosen = {w.id for w in holders} | request.declined
    extra = math.ceil(math.log2(len(index)))
    fresh_since = now - params.heartbeat_freshness_s
    return holders + index.draw(request.memory_mb, extra, sampler, chosen, fresh_since)


def decide(
    request: PlacementRequest,
    index: RegionIndex,
    *,
    now: float,
    params: MarketParams,
    app_machines: Mapping[str, int],
    sampler: Sampler,
    ledger: ReservationLedger | None = None,
    gates: Sequence[Term] = GATES,
    terms: Sequence[Term] = TERMS,
    filters: Sequence[Filter] = FILTERS,
) -> Decision:
    """Filter, then score the candidates, each seen with the `ledger`'s reservations on
    top of its heartbeat; cooler workers first, then by score; ties go to the lower
    worker id (stable)."""
    market = Market.of(request, params, now, app_machines)
    candidates = candidate_set(index, request, params, sampler, now)
    default = gates is GATES and terms is TERMS and filters is FILTERS
    filtered: list[Filtered] = []
    ranked: list[Scored] = []
    for heartbeat in candidates:
        worker = ledger.view(heartbeat, now) if ledger is not None else heartbeat
        if default and admissible(worker, market):
            ranked.append(score_default(worker, market))
            continue
        rejection = first_rejection(worker, market, filters)
        if rejection is not None:
            filtered.append(rejection)
        else:
            ranked.append(score(worker, market, gates, terms))
    ranked.sort(key=lambda s: (s.hot, -s.score, s.worker))
    return Decision(
        app=request.app, region=request.region, ranked=tuple(ranked),
        filtered=tuple(filtered), fleet=len(index), considered=len(candidates),
    )


def first_rejection(
    worker: WorkerStatus, market: Market, filters: Sequence[Filter]
) -> Filtered | None:
    for stage in filters:
        reason = stage.fn(worker, market)
        if reason is not None:
            return Filtered(worker.id, stage.name, reason)
    return None


def score(worker: WorkerStatus, market: Market, gates: Sequence[Term] = GATES,
          terms: Sequence[Term] = TERMS) -> Scored:
    """The gates' product times the terms' weighted mean, each value clamped to [0, 1]."""
    values: dict[str, float] = {}
    gate = 1.0
    for term in gates:
        value = values[term.name] = min(1.0, max(0.0, term.fn(worker, market)))
        gate *= value
    total = total_weight = 0.0
    for term in terms:
        value = values[term.name] = min(1.0, max(0.0, term.fn(worker, market)))
        total += term.weight * value
        total_weight += term.weight
    mean = total / total_weight if total_weight > 0 else 1.0
    hot = utilisation_after(worker, market.request) > market.params.hot_utilisation
    return Scored(worker=worker.id, url=worker.url, score=gate * mean, terms=values, hot=hot)


# -- the default stages, fused ------------------------------------------------------
# The same arithmetic as FILTERS, GATES and TERMS above in one pass, without a call per
# stage (generic stage calls cost ~40 times a plain scan); tests hold the two equal.

_WEIGHT_LAYERS, _WEIGHT_SPREAD = (term.weight for term in TERMS)
_WEIGHTS = _WEIGHT_LAYERS + _WEIGHT_SPREAD


def admissible(worker: WorkerStatus, market: Market) -> bool:
    """True when no filter of FILTERS rejects the worker (then there is no reason to say)."""
    request = market.request
    return (worker.region == request.region
            and market.now - worker.updated_at <= market.params.heartbeat_freshness_s
            and not worker.draining and not worker.disk_full
            and not (worker.pull_blocked and _must_pull(worker, market))
            and request.cpus <= worker.cpus - worker.reserved_cpus + 1e-9
            and request.memory_mb <= worker.memory_mb - worker.reserved_memory_mb
            and worker.id not in request.declined)


def score_default(worker: WorkerStatus, market: Market) -> Scored:
    """`score(worker, market)` with the default GATES and TERMS."""
    request = market.request
    cpus, memory = worker.cpus, worker.memory_mb
    used = (worker.reserved_cpus + request.cpus) / cpus if cpus > 0 else 1.0
    used_memory = (worker.reserved_memory_mb + request.memory_mb) / memory if memory > 0 else 1.0
    if used_memory > used:
        used = used_memory
    if used > 1.0:
        used = 1.0
    resources = piecewise_linear(market.params.utility_points, used)
    held = worker.layers
    missing = 0
    for digest, size in market.layers:
        if digest not in held:
            missing += size
    budget = market.pull_budget_bytes
    if budget > 0:
        layers = 1.0 - missing / budget if missing < budget else 0.0
    else:
        layers = float(missing == 0)
    spread = 1.0 / (1 + market.app_machines.get(worker.id, 0))
    starting = 1.0
    if worker.machines_starting > 0:
        starting = 1.0 / (1 + worker.machines_starting / (cpus if cpus > 1.0 else 1.0))
    mean = (_WEIGHT_LAYERS * layers + _WEIGHT_SPREAD * spread) / _WEIGHTS
    return Scored(worker.id, worker.url, resources * starting * mean,
                  {"resources": resources, "layers": layers, "spread": spread,
                   "starting": starting},
                  used > market.params.hot_utilisation)
