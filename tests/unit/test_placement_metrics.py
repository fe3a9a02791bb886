"""Placement's and the agents' metrics made at scrape time: machines by app, worker and
state, decisions and reconciler actions per app, only for apps that exist; the image
cache's pull counts (pure: plain values, no services)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from agent.metrics import AgentMetrics
from imagecache.stats import PullStats
from placement.core.reconcile import Seen
from placement.metrics import PlacementMetrics, machine_counts, outcome_class

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: bytes) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text.decode())
            for s in family.samples}


def test_machines_are_counted_by_worker_and_state_lost_ones_as_lost() -> None:
    seen = [Seen("a", "w1", "started", 1), Seen("b", "w1", "started", 1),
            Seen("c", "w2", "stopped", 1), Seen("d", "w3", "started", 1, live=False),
            Seen("e", "w2", "destroyed", 1)]
    assert machine_counts(seen) == {("w1", "started"): 2, ("w2", "stopped"): 1,
                                    ("w3", "lost"): 1}


def test_reconciler_outcomes_are_a_bounded_label() -> None:
    assert [outcome_class(o) for o in ("ok", "no capacity: max_machines=1", "409: busy",
                                       "pull failed: gone", "unreachable: x")] == [
        "ok", "no_capacity", "failed", "failed", "failed"]


@dataclass
class Reconciler:
    observed: dict[str, dict[tuple[str, str], int]] = field(default_factory=dict)
    actions: dict[str, dict[tuple[str, str], int]] = field(default_factory=dict)
    live_workers: int = 2


def test_only_apps_in_the_store_have_series_and_forgotten_decisions_go() -> None:
    apps = {"web", "gone"}
    reconciler = Reconciler(
        observed={"web": {("w1", "started"): 2}, "gone": {("w2", "stopped"): 1}},
        actions={"web": {("create", "ok"): 1}, "gone": {("destroy", "failed"): 3}})
    metrics = PlacementMetrics()
    metrics.watch(lambda: set(apps), reconciler)
    for app in ("web", "gone", "gone"):
        metrics.decided(app, "placed")
    got = samples(metrics.render())
    assert got[("thaw_placement_machines", frozenset(
        {("app", "web"), ("worker", "w1"), ("state", "started")}))] == 2
    assert got[("thaw_placement_decisions_total",
                frozenset({("app", "gone"), ("outcome", "placed")}))] == 2
    assert got[("thaw_placement_reconciler_actions_total", frozenset(
        {("app", "web"), ("action", "create"), ("outcome", "ok")}))] == 1
    assert got[("thaw_placement_live_workers", frozenset())] == 2
    assert got[("thaw_placement_apps", frozenset())] == 2

    apps.discard("gone")  # deleted: its series go at once, whatever is still kept
    got = samples(metrics.render())
    assert not any(("app", "gone") in labels for _, labels in got)
    assert ("thaw_placement_decisions_total",
            frozenset({("app", "web"), ("outcome", "placed")})) in got
    metrics.forget("gone")
    assert "gone" not in metrics.decisions


def test_the_agent_exports_the_image_caches_pull_counts() -> None:
    stats = PullStats()
    metrics = AgentMetrics()
    metrics.watch_cache(stats)
    stats.hits, stats.misses, stats.layers_downloaded, stats.bytes_downloaded = 3, 1, 2, 4096
    got = samples(metrics.render())
    assert got[("thaw_agent_image_cache_hits_total", frozenset())] == 3
    assert got[("thaw_agent_image_cache_misses_total", frozenset())] == 1
    assert got[("thaw_agent_layer_downloads_total", frozenset())] == 2
    assert got[("thaw_agent_layer_download_bytes_total", frozenset())] == 4096
    assert got[("thaw_agent_image_pull_failures_total", frozenset())] == 0
