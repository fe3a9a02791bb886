"""Prometheus metrics of one edge, made when /metrics is scraped.

Nothing here is touched per request: the shell counts into plain values
(edge/core/stats.py `AppStats`, one per app, on the app's view entry), and this
collector reads them, the view and the hold queues at scrape time. An app's
series are therefore exactly the apps the view holds: when an app is deleted
its entry goes, and so does every series labelled with it. Requests that routed
to no app (404 `unknown_app`, malformed requests) are counted under `app=""`.
Each edge has its own registry: `thaw up` runs it beside placement and agents.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from edge.config import EdgeConfig
from edge.core.clients import ClientTable
from edge.core.stats import AppStats, Histogram
from edge.routeguard import RouteGuard
from edge.view import AppEntry, View


class HeldCounts(Protocol):
    @property
    def total(self) -> int: ...

    def held(self, app: str) -> int: ...


class Dropped(Protocol):
    @property
    def dropped(self) -> int: ...

    @property
    def gone_unlogged(self) -> int: ...


class Rounds(Protocol):
    @property
    def failed_rounds(self) -> int: ...


class Thawing(Protocol):
    @property
    def results(self) -> Mapping[str, int]: ...


class Shedding(Protocol):
    @property
    def shed(self) -> Mapping[tuple[str, str], int]: ...

    @property
    def thaw(self) -> Thawing | None: ...


class Observed(Protocol):
    """What the collector reads of the edge's shell (read only)."""

    @property
    def view(self) -> View: ...
    @property
    def wakes(self) -> HeldCounts: ...
    @property
    def unrouted(self) -> AppStats: ...
    @property
    def connections(self) -> Sized: ...
    @property
    def config(self) -> EdgeConfig: ...
    @property
    def access_log(self) -> Dropped | None: ...
    @property
    def cold(self) -> Shedding: ...

    @property
    def load_share(self) -> Rounds | None: ...

    @property
    def route_guard(self) -> RouteGuard: ...

    @property
    def clients(self) -> ClientTable: ...


def histogram(family: HistogramMetricFamily, labels: list[str], values: Histogram) -> None:
    family.add_metric(labels, values.cumulative(), values.sum)


def app_families(apps: Iterable[tuple[str, AppEntry]], unrouted: AppStats,
                 queues: HeldCounts,
                 shed: Mapping[tuple[str, str], int] | None = None) -> list[Metric]:
    """Every per-app family, for the apps given (and app="" for unrouted answers);
    `shed`: requests answered at once rather than held, by (app, reason)."""
    requests = CounterMetricFamily(
        "thaw_edge_requests", "Requests answered, by app and status", labels=["app", "status"])
    duration = HistogramMetricFamily(
        "thaw_edge_request_duration_seconds",
        "Time from a request's head to the end of its answer (held time included), by app "
        "and code class (1xx: WebSocket tunnels, for as long as they were open)",
        labels=["app", "code_class"])
    in_flight = GaugeMetricFamily(
        "thaw_edge_in_flight_requests", "Requests at the app's machines now", labels=["app"])
    elsewhere = GaugeMetricFamily(
        "thaw_edge_other_edges_requests",
        "Other edges' requests at the app's machines, as they last shared them",
        labels=["app"])
    held = GaugeMetricFamily(
        "thaw_edge_held_requests", "Requests held now, waiting for a machine", labels=["app"])
    machines = GaugeMetricFamily(
        "thaw_edge_machines", "Machines the edge routes to now (started, not draining)",
        labels=["app"])
    hold = HistogramMetricFamily(
        "thaw_edge_hold_seconds", "Time a request was held (released, or 504 hold_timeout)",
        labels=["app"])
    wake = HistogramMetricFamily(
        "thaw_edge_wake_seconds",
        "Wakes: calls to placement (any result), or answered by the edge's own thaw",
        labels=["app"])
    phases = HistogramMetricFamily(
        "thaw_edge_wake_phase_seconds",
        "Placement's timings of answered wakes (place|pull|boot)", labels=["app", "phase"])
    wakes = CounterMetricFamily(
        "thaw_edge_wakes", "Wakes by result (ok|thawed|no_capacity|start_failed|deadline|…)",
        labels=["app", "result"])
    connect_errors = CounterMetricFamily(
        "thaw_edge_upstream_connect_errors", "Failed connects to the app's machines",
        labels=["app"])
    autostops = CounterMetricFamily(
        "thaw_edge_autostops", "Auto-stop calls by result (stopped|kept|error)",
        labels=["app", "result"])
    sheds = CounterMetricFamily(
        "thaw_edge_shed", "Held requests answered 503 at once, by reason (predicted_late: "
        "the app's start is predicted after their deadline)", labels=["app", "reason"])
    shed_by_app: dict[str, list[tuple[str, int]]] = {}
    for (app, reason), count in sorted((shed or {}).items()):
        shed_by_app.setdefault(app, []).append((reason, count))
    for status, values in sorted(unrouted.responses.items()):
        requests.add_metric(["", str(status)], values.count)
    for name, values in sorted(unrouted.by_class().items()):
        histogram(duration, ["", name], values)
    for app, entry in apps:
        stats = entry.stats
        for status, values in sorted(stats.responses.items()):
            requests.add_metric([app, str(status)], values.count)
        for name, values in sorted(stats.by_class().items()):
            histogram(duration, [app, name], values)
        in_flight.add_metric([app], entry.in_flight)
        elsewhere.add_metric([app], sum(m.elsewhere for m in entry.machines.values()))
        held.add_metric([app], queues.held(app))
        machines.add_metric([app], len(entry.routable))
        if stats.hold.count:
            histogram(hold, [app], stats.hold)
        if stats.wake.count:
            histogram(wake, [app], stats.wake)
        for phase, values in sorted(stats.phases.items()):
            histogram(phases, [app, phase], values)
        for result, count in sorted(stats.wakes.items()):
            wakes.add_metric([app, result], count)
        if stats.connect_errors:
            connect_errors.add_metric([app], stats.connect_errors)
        for result, count in sorted(stats.autostops.items()):
            autostops.add_metric([app, result], count)
        for reason, count in shed_by_app.get(app, ()):
            sheds.add_metric([app, reason], count)
    return [requests, duration, in_flight, elsewhere, held, machines, hold, wake, phases,
            wakes, connect_errors, autostops, sheds]


class EdgeCollector(Collector):
    def __init__(self, edge: Observed) -> None:
        self.edge = edge

    def collect(self) -> Iterator[Metric]:
        edge = self.edge
        queues = edge.wakes
        yield from app_families(sorted(edge.view.apps.items()), edge.unrouted, queues,
                                edge.cold.shed)
        yield GaugeMetricFamily("thaw_edge_held_requests_all",
                                "Requests held now, over all apps", value=queues.total)
        yield GaugeMetricFamily("thaw_edge_held_requests_limit",
                                "Requests the edge may hold over all apps (max_held_total)",
                                value=edge.config.max_held_total)
        yield GaugeMetricFamily("thaw_edge_connections", "Client connections open now",
                                value=len(edge.connections))
        refused = CounterMetricFamily(
            "thaw_edge_machine_records_refused",
            "Distinct machine records not routed by: not sealed (no_seal) or not by a ticket "
            "placement gave their worker (bad_seal)", labels=["reason"])
        for reason, count in sorted(edge.route_guard.refused.items()):
            refused.add_metric([reason], count)
        yield refused
        thaws = CounterMetricFamily(
            "thaw_edge_direct_thaws",
            "Suspended machines the edge asked their agents to start beside a wake, by "
            "result: thawed (answered started and sealed: held requests released), "
            "no_worker, unreachable, refused (not started), unsealed (not routed by)",
            labels=["result"])
        if edge.cold.thaw is not None:
            for result, count in sorted(edge.cold.thaw.results.items()):
                thaws.add_metric([result], count)
        yield thaws
        clients = edge.clients
        over = CounterMetricFamily(
            "thaw_edge_client_connections_refused",
            "Connections refused because their client was over its limits: barred (its "
            "connections were cut for abuse), connections (open), new_connections (per "
            "second), clients (the client table full of clients holding something)",
            labels=["reason"])
        for reason, count in sorted(clients.refused.items()):
            over.add_metric([reason], count)
        yield over
        yield CounterMetricFamily("thaw_edge_client_connections_cut",
                                  "Client connections cut for abuse (an HTTP/2 budget spent)",
                                  value=clients.struck)
        yield CounterMetricFamily(
            "thaw_edge_client_requests_deferred",
            "Times a request (HTTP/1) or a connection's read (HTTP/2) was left for the loop's "
            "next turn because its client had begun its share of requests in this one "
            "(client_requests_per_turn)",
            value=clients.deferred)
        yield GaugeMetricFamily("thaw_edge_clients_tracked",
                                "Clients the edge keeps limits for now", value=len(clients))
        load_share = edge.load_share
        if load_share is not None:
            yield CounterMetricFamily(
                "thaw_edge_load_share_failures",
                "Rounds of sharing loads with other edges that failed (Redis away: the edge "
                "counted its own requests only meanwhile)", value=load_share.failed_rounds)
        access_log = edge.access_log
        if access_log is not None:
            yield CounterMetricFamily("thaw_edge_access_log_dropped_lines",
                                      "Access-log lines dropped (the writer behind, or failing)",
                                      value=access_log.dropped)
            yield CounterMetricFamily(
                "thaw_edge_access_log_gone_unlogged",
                "Requests whose client went away (499) beyond the lines logged for them "
                "(10 a second)", value=access_log.gone_unlogged)

    def describe(self) -> Iterator[Any]:
        return iter(())  # families are made per scrape: nothing to check at register time


class EdgeMetrics:
    def __init__(self, edge: Observed) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(EdgeCollector(edge))

    def render(self) -> bytes:
        return generate_latest(self.registry)
