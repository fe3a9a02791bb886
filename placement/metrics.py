"""Prometheus metrics of one placement service (its own registry).

Counters of the whole service (offers, wake and decision latency, API requests)
are prometheus_client metrics. What is per app is made when /metrics is scraped
from what placement already keeps: the reconciler's last observation of each
app's machines (by worker and state) and the actions it took, and the market's
decisions by outcome. Only apps in the store are shown, so the series of a
deleted app are gone at the next scrape (and its counts are dropped when the
reconciler and the placer forget it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ground.registry.redis import PoolWaits
from placement.core.reconcile import Seen

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
WAKE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Observations(Protocol):
    """What the reconciler keeps for /metrics (placement/reconciling/reconciler.py)."""

    @property
    def observed(self) -> dict[str, dict[tuple[str, str], int]]: ...
    @property
    def actions(self) -> dict[str, dict[tuple[str, str], int]]: ...
    @property
    def live_workers(self) -> int: ...


class PlacementMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.wake_seconds = Histogram(
            "thaw_placement_wake_seconds", "Wake call latency by outcome", ["outcome"],
            buckets=WAKE_BUCKETS, registry=r,
        )
        self.decision_seconds = Histogram(
            "thaw_placement_decision_seconds", "Market decision latency (filter + score)",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.offers = Counter(
            "thaw_placement_offers", "Offers by result (accepted|no_capacity|draining|unreachable)",
            ["result"], registry=r,
        )
        self.requests = Counter(
            "thaw_placement_requests", "API requests by route and status", ["route", "status"],
            registry=r,
        )
        self.waits = Counter(
            "thaw_placement_waits", "Times a wake or a call waited for something that was "
            "busy or down instead of failing: store (the store unavailable, retried), "
            "store_pool (every database connection in use); Redis: "
            "thaw_placement_redis_pool_waits",
            ["on"], registry=r,
        )
        self.waits_seconds = Counter(
            "thaw_placement_waits_seconds", "Seconds spent in those waits", ["on"], registry=r,
        )
        r.register(RedisPoolWaits())
        self.decisions: dict[str, dict[str, int]] = {}  # app -> outcome -> decisions
        self.apps: Callable[[], set[str]] = set  # the apps that exist (set by `watch`)
        self.reconciler: Observations | None = None
        r.register(AppCollector(self))

    def watch(self, apps: Callable[[], set[str]], reconciler: Observations) -> None:
        """Where the per-app series come from: the names of the apps that exist, and the
        reconciler's observations."""
        self.apps = apps
        self.reconciler = reconciler

    def decided(self, app: str, outcome: str) -> None:
        counts = self.decisions.setdefault(app, {})
        counts[outcome] = counts.get(outcome, 0) + 1

    def waited(self, on: str, seconds: float) -> None:
        self.waits.labels(on).inc()
        self.waits_seconds.labels(on).inc(seconds)

    def forget(self, app: str) -> None:
        self.decisions.pop(app, None)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RedisPoolWaits(Collector):
    """The calls of this process that waited for a Redis connection (ground/registry/redis.py
    PoolWaits: every client's pool, counted where the pool is)."""

    def collect(self) -> Iterator[Metric]:
        count = CounterMetricFamily("thaw_placement_redis_pool_waits",
                                    "Redis calls that found their pool's connections all "
                                    "in use and waited for one")
        count.add_metric([], PoolWaits.count)
        yield count
        seconds = CounterMetricFamily("thaw_placement_redis_pool_waits_seconds",
                                      "Seconds Redis calls waited for a connection")
        seconds.add_metric([], PoolWaits.seconds)
        yield seconds


class AppCollector(Collector):
    def __init__(self, metrics: PlacementMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        metrics = self.metrics
        apps = metrics.apps()
        yield GaugeMetricFamily("thaw_placement_apps", "Apps in the store", value=len(apps))
        decisions = CounterMetricFamily(
            "thaw_placement_decisions", "Market decisions by app and outcome "
            "(placed|no_capacity)", labels=["app", "outcome"])
        for app, counts in sorted(metrics.decisions.items()):
            if app in apps:
                for outcome, count in sorted(counts.items()):
                    decisions.add_metric([app, outcome], count)
        yield decisions
        reconciler = metrics.reconciler
        if reconciler is None:
            return
        yield from reconciler_families(reconciler, apps)

    def describe(self) -> Iterator[Any]:
        return iter(())  # families are made per scrape


def reconciler_families(reconciler: Observations, apps: set[str]) -> list[Metric]:
    machines = GaugeMetricFamily(
        "thaw_placement_machines", "Machines of each app by worker and state, as the "
        "reconciler last observed them (lost: on a worker that is not live)",
        labels=["app", "worker", "state"])
    for app, counts in sorted(reconciler.observed.items()):
        if app in apps:
            for (worker, state), count in sorted(counts.items()):
                machines.add_metric([app, worker, state], count)
    actions = CounterMetricFamily(
        "thaw_placement_reconciler_actions", "Reconciler actions by app, action (start|"
        "create|replace|destroy|fence|release) and outcome (ok|no_capacity|failed)",
        labels=["app", "action", "outcome"])
    for app, counts in sorted(reconciler.actions.items()):
        if app in apps:
            for (action, outcome), count in sorted(counts.items()):
                actions.add_metric([app, action, outcome], count)
    live = GaugeMetricFamily("thaw_placement_live_workers",
                             "Workers live (fresh heartbeat, not draining or failed) at the "
                             "reconciler's last pass", value=reconciler.live_workers)
    return [machines, actions, live]


def machine_counts(seen: list[Seen]) -> dict[tuple[str, str], int]:
    """(worker, state) -> machines; a machine on a worker that is not live is "lost"
    whatever its last record said, and destroyed machines are not counted."""
    counts: dict[tuple[str, str], int] = {}
    for machine in seen:
        state = machine.state if machine.live else "lost"
        if state != "destroyed":
            key = (machine.worker, state)
            counts[key] = counts.get(key, 0) + 1
    return counts


def outcome_class(outcome: str) -> str:
    """A reconciler event's outcome (free text) as a bounded label."""
    if outcome == "ok":
        return "ok"
    return "no_capacity" if outcome.startswith("no capacity") else "failed"
