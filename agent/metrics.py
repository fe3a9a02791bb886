"""Prometheus metrics of one agent (its own registry: `thaw up` runs several agents)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.offers = Counter(
            "thaw_agent_offers", "Offers by result (accepted|repeated|no_capacity|draining)",
            ["result"], registry=r,
        )
        self.transitions = Counter(
            "thaw_agent_transitions", "Machine transitions", ["event", "state"], registry=r
        )
        self.launches = Counter("thaw_agent_launches", "Machine processes launched", registry=r)
        self.crashes = Counter("thaw_agent_crashes", "Unasked machine exits", registry=r)
        self.log_failures = Counter(
            "thaw_agent_oplog_write_failures", "Op log appends refused (disk full, I/O error)",
            registry=r)
        self.pulls = Counter("thaw_agent_image_pulls", "Image pulls requested", registry=r)
        self.ready_seconds = Histogram(
            "thaw_agent_start_seconds", "Start (pull + boot) to ready",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.machines = Gauge("thaw_agent_machines", "Machines by state", ["state"], registry=r)
        self.layer_bytes = Gauge("thaw_agent_cache_bytes", "Bytes of cached layers", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
