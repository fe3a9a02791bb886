"""Cache-aware placement in a simulator: the real market code over a synthetic fleet.

    .venv/bin/python loadtests/placement_sim.py [--placements 20000] [--workers 1000]

Virtual time; one arrival sequence replayed against every policy, each on its own copy
of the fleet. The fleet: heterogeneous workers (4, 8 or 16 cpus, 2 GB per cpu), each with
an LRU layer cache (`--cache-gb`, layers of running machines pinned, `--warm` of it
filled with Zipf-drawn images at start: a fleet that has been running) and its own pull
bandwidth. Images: 2,000 of 5 layers (2 of 12 shared base layers + 3 of their own),
requested with Zipf popularity; machines live an exponential lifetime. A start costs
pull (missing bytes / bandwidth) + boot. The policies:

- `least-allocated`, `most-allocated` (Nomad's binpack), `spread` (fewest machines of
  the app, then least allocated): resources only, full scans;
- `image-locality`: Kubernetes' ImageLocality (bytes of *whole* images present, scaled
  by the fraction of workers holding it) plus least-allocated, full scan;
- `thaw-before`: the market as it was (a weighted mean of resources, layers, spread,
  starting through the old utility curve, no hot tier), through the real `decide`;
- `thaw`: the market as it is (`placement.core.market.decide` with its defaults).

Both thaw policies read a `RegionIndex` the simulator keeps up to date with every change
(heartbeats without lag). A *hot spot* is a placement pushing a worker past 90 % of its
cpus or memory while the fleet's mean utilisation is below 70 %. Writes a table to stdout
and plots to docs/img/placement-sim-*.png.
"""

from __future__ import annotations

import argparse
import copy
import heapq
import math
import random
import statistics
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ground.registry.types import WorkerStatus
from placement.core.index import RegionIndex
from placement.core.market import (
    GATES,
    TERMS,
    Market,
    MarketParams,
    PlacementRequest,
    Term,
    decide,
    resources_term,
)

MB = 2**20
IMAGES, BASE_LAYERS, OWN_LAYERS = 2_000, 12, 3
BOOT_S = 0.25
HOT, COOL_MEAN = 0.9, 0.7
OLD_UTILITY = ((0.0, 0.3), (0.7, 1.0), (0.9, 0.5), (1.0, 0.0))
IMG = Path(__file__).resolve().parent.parent / "docs" / "img"


@dataclass
class Machine:
    worker: int
    app: int
    cpus: float
    memory_mb: int


@dataclass
class Worker:
    cpus: float
    memory_mb: int
    bandwidth: float  # bytes per second
    cache_bytes: int
    reserved_cpus: float = 0.0
    reserved_memory_mb: int = 0
    cache: OrderedDict[str, int] = field(default_factory=OrderedDict)  # LRU: oldest first
    pinned: dict[str, int] = field(default_factory=dict)  # digest -> machines using it
    cached_bytes: int = 0
    apps: dict[int, int] = field(default_factory=dict)

    def utilisation(self) -> float:
        return max(self.reserved_cpus / self.cpus, self.reserved_memory_mb / self.memory_mb)


class Fleet:
    """One policy's copy of the fleet, with the arrays the scanning baselines read."""

    def __init__(self, workers: list[Worker], layer_ids: dict[str, int]) -> None:
        self.workers = workers
        self.layer_ids = layer_ids
        n = len(workers)
        self.cpus = np.array([w.cpus for w in workers])
        self.memory = np.array([w.memory_mb for w in workers], dtype=float)
        self.used_cpus = np.zeros(n)
        self.used_memory = np.zeros(n)
        self.has = np.zeros((n, len(layer_ids)), dtype=bool)
        self.app_count: dict[int, np.ndarray] = {}
        self.index = RegionIndex()
        for i, w in enumerate(workers):
            for digest in w.cache:
                self.has[i, layer_ids[digest]] = True
            self.index.upsert(self.status(i))

    def status(self, i: int) -> WorkerStatus:
        w = self.workers[i]
        return WorkerStatus(id=f"w{i:05d}", epoch=1, region="sim", url="", cpus=w.cpus,
                            memory_mb=w.memory_mb, reserved_cpus=w.reserved_cpus,
                            reserved_memory_mb=w.reserved_memory_mb,
                            layers=dict(w.cache), updated_at=0.0)

    def mean_utilisation(self) -> float:
        return float(np.mean(np.maximum(self.used_cpus / self.cpus,
                                        self.used_memory / self.memory)))

    def place(self, i: int, app: int, layers: dict[str, int], cpus: float,
              memory_mb: int) -> int:
        """Reserve, pull what is missing (LRU eviction of unpinned layers), pin; bytes pulled."""
        w = self.workers[i]
        pulled = 0
        for digest, size in layers.items():
            if digest in w.cache:
                w.cache.move_to_end(digest)
            else:
                w.cache[digest] = size
                w.cached_bytes += size
                pulled += size
                self.has[i, self.layer_ids[digest]] = True
            w.pinned[digest] = w.pinned.get(digest, 0) + 1
        self._evict(i)
        w.reserved_cpus += cpus
        w.reserved_memory_mb += memory_mb
        w.apps[app] = w.apps.get(app, 0) + 1
        self.used_cpus[i] += cpus
        self.used_memory[i] += memory_mb
        self.app_count.setdefault(app, np.zeros(len(self.workers), dtype=np.int32))[i] += 1
        self.index.upsert(self.status(i))
        return pulled

    def leave(self, m: Machine, layers: dict[str, int]) -> None:
        w = self.workers[m.worker]
        for digest in layers:
            w.pinned[digest] -= 1
            if not w.pinned[digest]:
                del w.pinned[digest]
        w.reserved_cpus -= m.cpus
        w.reserved_memory_mb -= m.memory_mb
        w.apps[m.app] -= 1
        self.used_cpus[m.worker] -= m.cpus
        self.used_memory[m.worker] -= m.memory_mb
        self.app_count[m.app][m.worker] -= 1
        self.index.upsert(self.status(m.worker))

    def _evict(self, i: int) -> None:
        w = self.workers[i]
        for digest in list(w.cache):
            if w.cached_bytes <= w.cache_bytes:
                return
            if digest not in w.pinned:
                w.cached_bytes -= w.cache.pop(digest)
                self.has[i, self.layer_ids[digest]] = False


@dataclass(frozen=True)
class Ask:
    app: int
    layers: dict[str, int]
    layer_idx: np.ndarray
    sizes: np.ndarray
    cpus: float
    memory_mb: int


Policy = Callable[[Fleet, Ask, random.Random], int | None]


def _fits(f: Fleet, ask: Ask) -> tuple[np.ndarray, np.ndarray]:
    after = np.maximum((f.used_cpus + ask.cpus) / f.cpus,
                       (f.used_memory + ask.memory_mb) / f.memory)
    ok = (f.used_cpus + ask.cpus <= f.cpus + 1e-9) & (f.used_memory + ask.memory_mb <= f.memory)
    return ok, after


def _best(ok: np.ndarray, score: np.ndarray) -> int | None:
    if not ok.any():
        return None
    return int(np.argmax(np.where(ok, score, -np.inf)))


def least_allocated(f: Fleet, ask: Ask, rng: random.Random) -> int | None:
    ok, after = _fits(f, ask)
    return _best(ok, -after)


def most_allocated(f: Fleet, ask: Ask, rng: random.Random) -> int | None:
    ok, after = _fits(f, ask)
    return _best(ok, after)


def spread(f: Fleet, ask: Ask, rng: random.Random) -> int | None:
    ok, after = _fits(f, ask)
    count = f.app_count.get(ask.app, np.zeros(len(f.workers), dtype=np.int32))
    return _best(ok, -count * 10.0 - after)


def image_locality(f: Fleet, ask: Ask, rng: random.Random) -> int | None:
    """Kubernetes: ImageLocality (whole image present: its bytes times the share of nodes holding
    it, clamped to [23 MB, 1000 MB] and scaled to 0..100) + LeastAllocated (0..100)."""
    ok, after = _fits(f, ask)
    whole = f.has[:, ask.layer_idx].all(axis=1)
    size = float(ask.sizes.sum())
    scaled = size * whole.mean()
    locality = np.where(whole, (min(max(scaled, 23 * MB), 1000 * MB) - 23 * MB)
                        / (977 * MB) * 100, 0.0)
    return _best(ok, locality + (1 - after) * 100)


def market_policy(params: MarketParams, gates: tuple[Term, ...],
                  terms: tuple[Term, ...]) -> Policy:
    def choose(f: Fleet, ask: Ask, rng: random.Random) -> int | None:
        request = PlacementRequest(app=f"app{ask.app}", region="sim", cpus=ask.cpus,
                                   memory_mb=ask.memory_mb, image_layers=ask.layers)
        app_machines = {f"w{i:05d}": int(n) for i, n in enumerate(
            f.app_count.get(ask.app, ())) if n}
        decision = decide(request, f.index, now=0.0, params=params,
                          app_machines=app_machines, sampler=rng, gates=gates, terms=terms)
        return int(decision.ranked[0].worker[1:]) if decision.ranked else None
    return choose


def starting_before(worker: WorkerStatus, market: Market) -> float:
    """`starting` as it was, a term of the mean: 1 / (1 + starts in flight)."""
    return 1.0 / (1 + max(0, worker.machines_starting))


THAW_BEFORE = market_policy(
    MarketParams(utility_points=OLD_UTILITY, hot_utilisation=1.0), (),
    (Term("resources", resources_term, 1.0), *TERMS,
     Term("starting", starting_before, 0.25)))
THAW = market_policy(MarketParams(), GATES, TERMS)

POLICIES: dict[str, Policy] = {
    "least-allocated": least_allocated, "most-allocated": most_allocated,
    "spread": spread, "image-locality": image_locality,
    "thaw-before": THAW_BEFORE, "thaw": THAW,
}


@dataclass
class Outcome:
    name: str
    pulled: int = 0
    hot_spots: int = 0
    no_capacity: int = 0
    starts: list[float] = field(default_factory=list)
    utilisation: list[float] = field(default_factory=list)  # per worker, sampled
    seconds: float = 0.0


def world(args: argparse.Namespace) -> tuple[list[dict[str, int]], list[Worker]]:
    rng = random.Random(args.seed)
    bases = {f"base{b:02d}": rng.randint(50, 200) * MB for b in range(BASE_LAYERS)}
    images = []
    for i in range(IMAGES):
        layers = {d: bases[d] for d in rng.sample(sorted(bases), 2)}
        layers.update({f"img{i:04d}-{j}": rng.randint(5, 100) * MB for j in range(OWN_LAYERS)})
        images.append(layers)
    workers = []
    weights = zipf_weights()
    for _ in range(args.workers):
        cpus = rng.choice([4.0, 8.0, 16.0])
        worker = Worker(cpus, int(cpus * 2048), rng.uniform(50, 150) * MB,
                        int(args.cache_gb * 2**30))
        while worker.cached_bytes < args.warm * worker.cache_bytes:  # a fleet that has run
            for digest, size in images[rng.choices(range(IMAGES), weights)[0]].items():
                if digest not in worker.cache:
                    worker.cache[digest] = size
                    worker.cached_bytes += size
        workers.append(worker)
    return images, workers


def zipf_weights() -> list[float]:
    return [1 / rank ** 1.1 for rank in range(1, IMAGES + 1)]


def arrivals(args: argparse.Namespace, images: list[dict[str, int]],
             capacity_cpus: float) -> list[tuple[float, int, float, int, float]]:
    """(at, image, cpus, memory_mb, lifetime_s): lifetimes sized so that the fleet's
    mean utilisation settles near `--utilisation`."""
    rng = random.Random(args.seed + 1)
    weights = zipf_weights()
    sizes = [(0.25, 512), (0.5, 1024), (1.0, 2048), (2.0, 4096)]
    mean_cpus = statistics.mean(c for c, _ in sizes)
    rate = 10.0
    lifetime = args.utilisation * capacity_cpus / mean_cpus / rate
    at = 0.0
    out = []
    for image in rng.choices(range(IMAGES), weights, k=args.placements):
        at += rng.expovariate(rate)
        cpus, memory = rng.choice(sizes)
        out.append((at, image, cpus, memory, rng.expovariate(1 / lifetime)))
    return out


def run(name: str, policy: Policy, args: argparse.Namespace,
        start: tuple[list[dict[str, int]], list[Worker]]) -> Outcome:
    images, workers = start[0], copy.deepcopy(start[1])
    layer_ids = {d: i for i, d in enumerate(sorted({d for im in images for d in im}))}
    fleet = Fleet(workers, layer_ids)
    asks = {}
    outcome = Outcome(name)
    rng = random.Random(args.seed + 2)
    leaving: list[tuple[float, int, Machine]] = []
    began = time.perf_counter()
    for n, (at, image, cpus, memory, life) in enumerate(
            arrivals(args, images, float(fleet.cpus.sum()))):
        while leaving and leaving[0][0] <= at:
            _, img, machine = heapq.heappop(leaving)
            fleet.leave(machine, images[img])
        ask = asks.get(image)
        if ask is None:
            layers = images[image]
            ask = asks[image] = Ask(image, layers, np.array([layer_ids[d] for d in layers]),
                                    np.array(list(layers.values()), dtype=float), 0, 0)
        ask = Ask(ask.app, ask.layers, ask.layer_idx, ask.sizes, cpus, memory)
        chosen = policy(fleet, ask, rng)
        if chosen is None:
            outcome.no_capacity += 1
            continue
        mean = fleet.mean_utilisation()
        pulled = fleet.place(chosen, image, images[image], cpus, memory)
        if workers[chosen].utilisation() > HOT + 1e-9 and mean < COOL_MEAN:
            outcome.hot_spots += 1
        outcome.pulled += pulled
        outcome.starts.append(pulled / workers[chosen].bandwidth + BOOT_S)
        heapq.heappush(leaving, (at + life, image, Machine(chosen, image, cpus, memory)))
        if n % 1000 == 999 and n > args.placements // 2:
            outcome.utilisation.extend(w.utilisation() for w in workers)
    outcome.seconds = time.perf_counter() - began
    return outcome


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else math.nan


def report(outcomes: list[Outcome], args: argparse.Namespace) -> None:
    baseline = next(o for o in outcomes if o.name == "least-allocated").pulled
    print(f"{args.placements} placements over {args.workers} workers, {args.cache_gb:g} GB "
          f"caches ({args.warm:.0%} warm at start), mean utilisation target "
          f"{args.utilisation:.0%}, seed {args.seed}\n")
    print("| policy | bytes pulled (GB) | vs least-allocated | hot spots | no capacity "
          "| start p50 / p99 (s) | utilisation p10 / p50 / p90 / max | sim time (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for o in outcomes:
        u = o.utilisation
        print(f"| {o.name} | {o.pulled / 2**30:,.1f} | {o.pulled / baseline:.3f} | "
              f"{o.hot_spots} | {o.no_capacity} | {pct(o.starts, .5):.2f} / "
              f"{pct(o.starts, .99):.2f} | {pct(u, .1):.2f} / {pct(u, .5):.2f} / "
              f"{pct(u, .9):.2f} / {max(u, default=0):.2f} | {o.seconds:.1f} |")


def plot(outcomes: list[Outcome]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    IMG.mkdir(parents=True, exist_ok=True)
    names = [o.name for o in outcomes]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.bar(names, [o.pulled / 2**30 for o in outcomes], color="tab:blue")
    left.set_yscale("log")
    left.set_ylabel("GB pulled (log)")
    left.set_title("Bytes pulled")
    left.tick_params(axis="x", rotation=30)
    right.bar(names, [o.hot_spots for o in outcomes], color="tab:red")
    right.set_title("Hot spots (> 90 % while mean < 70 %)")
    right.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(IMG / "placement-sim-pulls.png", dpi=100)
    plt.close(fig)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for o in outcomes:
        u = sorted(o.utilisation)
        left.plot(u, [i / len(u) for i in range(len(u))], label=o.name)
        s = sorted(o.starts)
        right.plot(s, [i / len(s) for i in range(len(s))], label=o.name)
    left.set_xlabel("worker utilisation (max of cpu, memory)")
    left.set_ylabel("fraction of workers")
    left.set_title("Utilisation CDF (second half, sampled)")
    left.axvline(HOT, color="grey", linestyle=":")
    right.set_xscale("log")
    right.minorticks_off()
    right.set_xticks([0.25, 0.5, 1, 2, 4, 8], ["0.25", "0.5", "1", "2", "4", "8"])
    right.set_xlabel("start time: pull + boot (s, log)")
    right.set_title("Start time CDF")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(IMG / "placement-sim-utilisation.png", dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--placements", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=1_000)
    parser.add_argument("--cache-gb", type=float, default=20.0)
    parser.add_argument("--utilisation", type=float, default=0.6)
    parser.add_argument("--warm", type=float, default=0.5,
                        help="fill each cache this far with Zipf-drawn images at start")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args()
    outcomes = []
    start = world(args)
    for name in args.policies.split(","):
        outcomes.append(run(name, POLICIES[name], args, start))
        print(f"{name}: done in {outcomes[-1].seconds:.1f} s", file=sys.stderr, flush=True)
    report(outcomes, args)
    if not args.no_plots:
        plot(outcomes)


if __name__ == "__main__":
    main()
