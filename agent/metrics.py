"""Prometheus metrics of one agent (its own registry: `thaw up` runs several agents).

The image cache's pull counts are read when /metrics is scraped (`watch_cache`):
a pull that found the image whole is a hit, one that downloaded or unpacked
anything a miss, so the hit ratio is hits / (hits + misses) of pulls (a machine
restarted on its cached image is no pull at all).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from imagecache.stats import PullStats


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
        self.exits = Counter(
            "thaw_agent_machine_exits",
            "Machine processes ended, by how (exited|signalled|oom; exited(?) counts as "
            "exited)", ["reason"], registry=r)
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

    def watch_cache(self, stats: PullStats) -> None:
        """Export the image cache's pull counts (`stats` is updated in place)."""
        self.registry.register(CacheCollector(stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class CacheCollector(Collector):
    def __init__(self, stats: PullStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self.stats
        for name, text, value in (
            ("thaw_agent_image_cache_hits", "Image pulls that found the image whole",
             stats.hits),
            ("thaw_agent_image_cache_misses", "Image pulls that downloaded or unpacked",
             stats.misses),
            ("thaw_agent_image_pull_failures", "Image pulls that failed", stats.failures),
            ("thaw_agent_layer_downloads", "Layer blobs downloaded", stats.layers_downloaded),
            ("thaw_agent_layer_download_bytes", "Bytes of layer blobs downloaded",
             stats.bytes_downloaded),
        ):
            yield CounterMetricFamily(name, text, value=value)

    def describe(self) -> Iterator[Any]:
        return iter(())
