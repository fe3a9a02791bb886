"""The edge's metrics: histogram bucket math, rendering at scrape time, bounded label sets
(pure: plain values and a view, no sockets)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from edge.config import EdgeConfig
from edge.core.clients import ClientTable
from edge.core.stats import REQUEST_SECONDS, AppStats, Histogram, code_class
from edge.metrics import EdgeMetrics
from edge.routeguard import RouteGuard
from edge.view import View
from ground.appconfig import parse
from tests.support.credentials import RING


def test_a_value_on_a_bound_counts_in_that_bucket_and_one_above_every_bound_in_inf() -> None:
    histogram = Histogram((0.1, 1.0))
    for value in (0.0, 0.1, 0.10001, 1.0, 1.5, 99.0):
        histogram.observe(value)
    assert histogram.counts == [2, 2, 2]
    assert histogram.cumulative() == [("0.1", 2), ("1.0", 4), ("+Inf", 6)]
    assert histogram.count == 6
    assert abs(histogram.sum - (0.1 + 0.10001 + 1.0 + 1.5 + 99.0)) < 1e-9


def test_added_histograms_keep_every_observation() -> None:
    a, b = Histogram((1.0,)), Histogram((1.0,))
    a.observe(0.5)
    b.observe(2.0)
    b.observe(0.25)
    a.add(b)
    assert a.cumulative() == [("1.0", 2), ("+Inf", 3)] and a.sum == 2.75


def test_statuses_fall_in_their_code_class() -> None:
    assert [code_class(s) for s in (101, 200, 204, 302, 404, 499, 503, 504, 0, 600)] == [
        "1xx", "2xx", "2xx", "3xx", "4xx", "4xx", "5xx", "5xx", "other", "other"]
    stats = AppStats()
    for status, seconds in ((200, 0.0004), (204, 0.002), (503, 0.5), (504, 30.0)):
        stats.answered(status, seconds)
    classes = stats.by_class()
    assert sorted(classes) == ["2xx", "5xx"]
    assert classes["2xx"].count == 2 and classes["5xx"].count == 2
    assert classes["2xx"].bounds == REQUEST_SECONDS


@dataclass
class Wakes:
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def held(self, app: str) -> int:
        return self.counts.get(app, 0)


@dataclass
class Thaw:
    results: dict[str, int] = field(default_factory=dict)


@dataclass
class Cold:
    shed: dict[tuple[str, str], int] = field(default_factory=dict)
    thaw: Thaw | None = field(default_factory=Thaw)


@dataclass
class FakeEdge:
    """What the collector reads of the shell, as plain values."""

    view: View
    wakes: Wakes = field(default_factory=Wakes)
    unrouted: AppStats = field(default_factory=AppStats)
    connections: set[Any] = field(default_factory=set)
    config: EdgeConfig = field(default_factory=lambda: EdgeConfig(
        placement_url="http://127.0.0.1:9", cluster_keys=RING, max_held_total=500))
    access_log: Any = None
    cold: Cold = field(default_factory=lambda: Cold())
    load_share: Any = None
    route_guard: RouteGuard = field(default_factory=lambda: RouteGuard(None))
    clients: ClientTable = field(default_factory=lambda: ClientTable(10, 10.0, 10.0))


@dataclass
class Rounds:
    failed_rounds: int = 0


def edge_with(*apps: str) -> FakeEdge:
    view = View("localhost", lambda: 0.0)
    for name in apps:
        view.set_app(name, parse({"name": name, "image": "x"}))
    return FakeEdge(view)


def samples(edge: FakeEdge) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = EdgeMetrics(edge).render().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_duration_histogram_renders_cumulative_buckets_per_app_and_code_class() -> None:
    edge = edge_with("web")
    stats = edge.view.apps["web"].stats
    for seconds in (0.0003, 0.0004, 0.002, 7.0):
        stats.answered(200, seconds)
    stats.answered(504, 30.0)
    edge.unrouted.answered(404, 0.0001)
    got = samples(edge)

    def bucket(le: str, code: str = "2xx", app: str = "web") -> float:
        key = frozenset({("app", app), ("code_class", code), ("le", le)})
        return got[("thaw_edge_request_duration_seconds_bucket", key)]

    assert (bucket("0.0005"), bucket("0.0025"), bucket("5.0"), bucket("10.0")) == (2, 3, 3, 4)
    assert bucket("+Inf") == 4 and bucket("10.0", "5xx") == 0 and bucket("30.0", "5xx") == 1
    web_2xx = frozenset({("app", "web"), ("code_class", "2xx")})
    assert got[("thaw_edge_request_duration_seconds_count", web_2xx)] == 4
    assert abs(got[("thaw_edge_request_duration_seconds_sum", web_2xx)] - 7.0027) < 1e-9
    assert got[("thaw_edge_requests_total", frozenset({("app", "web"), ("status", "200")}))] == 4
    assert got[("thaw_edge_requests_total", frozenset({("app", "web"), ("status", "504")}))] == 1
    assert got[("thaw_edge_requests_total", frozenset({("app", ""), ("status", "404")}))] == 1
    assert bucket("0.0005", "4xx", "") == 1


def test_gauges_of_held_and_in_flight_requests_come_from_the_view_and_the_queues() -> None:
    edge = edge_with("web", "api")
    edge.view.apps["web"].in_flight = 7
    edge.wakes.counts = {"api": 3}
    edge.view.add_started("web", "m1", "127.0.0.1:9000")
    got = samples(edge)
    assert got[("thaw_edge_in_flight_requests", frozenset({("app", "web")}))] == 7
    assert got[("thaw_edge_held_requests", frozenset({("app", "api")}))] == 3
    assert got[("thaw_edge_held_requests", frozenset({("app", "web")}))] == 0
    assert got[("thaw_edge_machines", frozenset({("app", "web")}))] == 1
    assert got[("thaw_edge_held_requests_all", frozenset())] == 3
    assert got[("thaw_edge_held_requests_limit", frozenset())] == 500
    assert got[("thaw_edge_other_edges_requests", frozenset({("app", "web")}))] == 0
    assert ("thaw_edge_load_share_failures_total", frozenset()) not in got  # one edge


def test_other_edges_requests_and_failed_sharing_rounds_are_reported() -> None:
    edge = edge_with("web")
    for n in (1, 2):
        edge.view.add_started("web", f"m{n}", f"127.0.0.1:900{n}")
    edge.view.apps["web"].machines["m1"].elsewhere = 3
    edge.view.apps["web"].machines["m2"].elsewhere = 2
    edge.load_share = Rounds(failed_rounds=4)
    got = samples(edge)
    assert got[("thaw_edge_other_edges_requests", frozenset({("app", "web")}))] == 5
    assert got[("thaw_edge_load_share_failures_total", frozenset())] == 4


def test_machine_records_refused_are_counted_by_reason() -> None:
    edge = edge_with("web")
    edge.route_guard.refused.update({"bad_seal": 2, "no_seal": 1})
    got = samples(edge)
    assert got[("thaw_edge_machine_records_refused_total",
                frozenset({("reason", "bad_seal")}))] == 2
    assert got[("thaw_edge_machine_records_refused_total",
                frozenset({("reason", "no_seal")}))] == 1


def test_wakes_holds_phases_and_autostops_are_per_app() -> None:
    edge = edge_with("web")
    stats = edge.view.apps["web"].stats
    stats.woke("ok", 0.2, (12.0, 0.0, 150.0))
    stats.woke("no_capacity", 1.0, None)
    stats.hold.observe(0.25)
    stats.autostopped("stopped")
    stats.connect_errors += 2
    edge.cold.shed[("web", "predicted_late")] = 3
    assert edge.cold.thaw is not None
    edge.cold.thaw.results.update(thawed=4, unreachable=1)
    got = samples(edge)
    web = ("app", "web")
    assert got[("thaw_edge_wakes_total", frozenset({web, ("result", "ok")}))] == 1
    assert got[("thaw_edge_wakes_total", frozenset({web, ("result", "no_capacity")}))] == 1
    assert got[("thaw_edge_wake_seconds_count", frozenset({web}))] == 2
    assert got[("thaw_edge_wake_phase_seconds_sum", frozenset({web, ("phase", "boot")}))] == 0.15
    assert got[("thaw_edge_wake_phase_seconds_count", frozenset({web, ("phase", "pull")}))] == 1
    assert got[("thaw_edge_hold_seconds_bucket", frozenset({web, ("le", "0.25")}))] == 1
    assert got[("thaw_edge_autostops_total", frozenset({web, ("result", "stopped")}))] == 1
    assert got[("thaw_edge_upstream_connect_errors_total", frozenset({web}))] == 2
    assert got[("thaw_edge_shed_total", frozenset({web, ("reason", "predicted_late")}))] == 3
    assert got[("thaw_edge_direct_thaws_total", frozenset({("result", "thawed")}))] == 4
    assert got[("thaw_edge_direct_thaws_total", frozenset({("result", "unreachable")}))] == 1


def test_every_series_of_an_app_goes_when_the_view_drops_the_app() -> None:
    edge = edge_with("gone", "kept")
    for name in ("gone", "kept"):
        stats = edge.view.apps[name].stats
        stats.answered(200, 0.001)
        stats.woke("ok", 0.1, (1.0, 2.0, 3.0))
        stats.hold.observe(0.1)
        stats.autostopped("kept")
        stats.connect_errors += 1
        edge.cold.shed[(name, "predicted_late")] = 1
    dropped = edge.view.apps["gone"].stats
    assert any(("app", "gone") in labels for _, labels in samples(edge))
    edge.view.set_app("gone", None)
    dropped.answered(200, 0.001)  # a late answer of the deleted app brings nothing back
    got = samples(edge)
    assert not any(("app", "gone") in labels for _, labels in got)
    kept = {name for name, labels in got if ("app", "kept") in labels}
    assert {"thaw_edge_requests_total", "thaw_edge_request_duration_seconds_count",
            "thaw_edge_hold_seconds_count", "thaw_edge_wake_phase_seconds_count",
            "thaw_edge_autostops_total", "thaw_edge_upstream_connect_errors_total",
            "thaw_edge_shed_total"} <= kept


def test_connections_refused_and_cut_per_client_are_counted() -> None:
    edge = edge_with("web")
    for _ in range(11):
        edge.clients.open(b"10.0.0.9", 0.0)
    edge.clients.strike(b"10.0.0.9", 0.0)
    edge.clients.open(b"10.0.0.9", 0.5)
    state = edge.clients.state(b"10.0.0.9")
    assert state is not None
    while edge.clients.take_turn(state, 1):  # its share of turn 1, and one more
        pass
    got = samples(edge)
    refused = "thaw_edge_client_connections_refused_total"
    assert got[(refused, frozenset({("reason", "connections")}))] == 1
    assert got[(refused, frozenset({("reason", "barred")}))] == 1
    assert got[("thaw_edge_client_connections_cut_total", frozenset())] == 1
    assert got[("thaw_edge_client_requests_deferred_total", frozenset())] == 1
    assert got[("thaw_edge_clients_tracked", frozenset())] == 1
