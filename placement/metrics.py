"""Prometheus metrics of one placement service (its own registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
WAKE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


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
        self.decisions = Counter(
            "thaw_placement_decisions", "Decisions by outcome (placed|no_capacity)", ["outcome"],
            registry=r,
        )
        self.requests = Counter(
            "thaw_placement_requests", "API requests by route and status", ["route", "status"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
