"""Prometheus metrics of one edge (its own registry: `thaw up` runs it beside others)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

SECONDS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class RequestCounts(Collector):
    """Requests by (app, status) in a plain dict: the hot path pays one dict update."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, int], int] = {}

    def add(self, app: str, status: int) -> None:
        key = (app, status)
        self.counts[key] = self.counts.get(key, 0) + 1

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "thaw_edge_requests", "Requests answered, by app and status", labels=["app", "status"]
        )
        for (app, status), count in sorted(self.counts.items()):
            family.add_metric([app, str(status)], count)
        yield family


class EdgeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = RequestCounts()
        r.register(self.requests)
        self.held = Gauge("thaw_edge_held_requests", "Requests held now", ["app"], registry=r)
        self.hold_seconds = Histogram(
            "thaw_edge_hold_seconds", "Time a request was held", ["app"], buckets=SECONDS,
            registry=r,
        )
        self.wake_seconds = Histogram(
            "thaw_edge_wake_seconds", "Wake call latency", ["app"], buckets=SECONDS, registry=r
        )
        self.wake_phase_seconds = Histogram(
            "thaw_edge_wake_phase_seconds", "Placement timings of wakes (place|pull|boot)",
            ["phase"], buckets=SECONDS, registry=r,
        )
        self.wakes = Counter(
            "thaw_edge_wakes", "Wakes by result (ok|no_capacity|start_failed|deadline|error)",
            ["app", "result"], registry=r,
        )
        self.connect_errors = Counter(
            "thaw_edge_upstream_connect_errors", "Failed connects to machines", ["app"],
            registry=r,
        )
        self.autostops = Counter(
            "thaw_edge_autostops", "Auto-stop requests by result (stopped|kept|error)",
            ["app", "result"], registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
