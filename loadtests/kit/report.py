"""A load test's report: what the tool measured and what the platform did, in one table
and one picture.

Inputs are files the run wrote: the tool's points (k6's `--out csv=`, or the locustfile's
`--samples-csv` in the same columns: metric_name, timestamp in ms, metric_value), its
verdict (k6's `--summary-export` JSON, or the locustfile's `--summary-json` in the same
shape), the machines sampled from placement's API (`machines.csv`: timestamp_ms, app,
state, count) and the driver's events (a deploy, a kill). Pure but for reading files:
values in, values out (the picture is loadtests/kit/plot.py).

The summary's figures are the tool's own where its verdict has them (requests, the rate,
errors, percentiles, hold and cold): one number per figure, computed once, by the tool,
the same in the table as in the tool's own output. The rate is requests over the whole
run as the tool timed it (k6's `http_reqs` rate; the locustfile's the same way). Points
stand in only for a figure a verdict lacks (the tool failed before writing one).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests.locust.slo import percentile

# the metrics a report reads; k6 writes ~15 per request, most of them about sockets
METRICS = ("http_req_duration", "errors", "hold_ms", "cold_ms", "warm_ms")
MACHINE_COLUMNS = ["timestamp_ms", "app", "state", "count"]
NICE_BINS_S = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class Point:
    at_ms: float  # unix time, ms
    value: float


@dataclass(frozen=True)
class Threshold:
    metric: str
    expression: str
    ok: bool


@dataclass(frozen=True)
class Event:
    at_ms: float
    label: str


@dataclass(frozen=True)
class MachineCount:
    at_ms: float
    app: str
    state: str
    count: int


@dataclass(frozen=True)
class Bin:
    start_s: float  # seconds from the run's origin
    requests: int
    errors: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    cold: int


@dataclass(frozen=True)
class Summary:
    scenario: str
    tool: str
    requests: int
    errors: int
    rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    cold: int
    hold_p99_ms: float
    cold_p99_ms: float
    machines_max: int
    thresholds: tuple[Threshold, ...] = field(default=())

    @property
    def passed(self) -> bool:
        return all(t.ok for t in self.thresholds)


def _text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path), newline="")
    return open(path, newline="")


def parse_points(lines: Iterable[str]) -> dict[str, list[Point]]:
    """Points by metric from CSV lines with a header naming `metric_name`, `timestamp` (unix
    ms; k6 with K6_CSV_TIME_FORMAT=unix_milli) and `metric_value`; other metrics and rows
    that do not parse are skipped."""
    points: dict[str, list[Point]] = {name: [] for name in METRICS}
    for row in csv.DictReader(lines):
        series = points.get(row.get("metric_name") or "")
        if series is None:
            continue
        try:
            series.append(Point(float(row["timestamp"]), float(row["metric_value"])))
        except (KeyError, TypeError, ValueError):
            continue
    return points


def read_points(path: Path) -> dict[str, list[Point]]:
    """A points file; no points when the tool wrote none (it failed to start)."""
    if not path.exists():
        return parse_points([])
    with _text(path) as lines:
        return parse_points(lines)


def tool_figure(export: dict[str, Any], metric: str, stat: str) -> float | None:
    """One figure of the tool's own summary (`metrics.<metric>.<stat>`), None when absent."""
    value = ((export.get("metrics") or {}).get(metric) or {}).get(stat)
    return float(value) if isinstance(value, int | float) else None


def parse_thresholds(export: dict[str, Any]) -> list[Threshold]:
    """From k6's `--summary-export` shape: `metrics.<name>.thresholds = {expr: crossed}`."""
    found = []
    for metric, values in sorted(export.get("metrics", {}).items()):
        for expression, crossed in (values.get("thresholds") or {}).items():
            found.append(Threshold(metric, expression, not crossed))
    return found


def read_export(path: Path) -> dict[str, Any]:
    """The tool's verdict file ({} when it wrote none or it does not parse)."""
    try:
        export = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return export if isinstance(export, dict) else {}


def parse_machines(lines: Iterable[str]) -> list[MachineCount]:
    return [MachineCount(float(r["timestamp_ms"]), r["app"], r["state"], int(r["count"]))
            for r in csv.DictReader(lines)]


STANDBY = ("created", "stopped", "suspended")  # machines that wake without a placement


def machines_in(samples: Sequence[MachineCount], *states: str) -> list[tuple[float, int]]:
    """(unix ms, machines in any of `states` over every app) per sampling round, in time
    order."""
    rounds: dict[float, int] = defaultdict(int)
    for sample in samples:
        rounds[sample.at_ms] += sample.count if sample.state in states else 0
    return sorted(rounds.items())


def bin_width_s(span_s: float, bins: int = 60) -> float:
    """A round bin width giving about `bins` bins over `span_s` (0.1 s to 60 s)."""
    wanted = span_s / bins
    return next((w for w in NICE_BINS_S if w >= wanted), NICE_BINS_S[-1])


def bins(points: dict[str, list[Point]], origin_ms: float, width_s: float) -> list[Bin]:
    """Requests, errors, latency percentiles and cold requests per `width_s` bin, by when
    each answer came (the tools stamp a request when it ends); empty bins included."""
    durations: dict[int, list[float]] = defaultdict(list)
    errors: dict[int, int] = defaultdict(int)
    cold: dict[int, int] = defaultdict(int)

    def index(at_ms: float) -> int:
        return max(0, math.floor((at_ms - origin_ms) / 1000.0 / width_s))

    for p in points["http_req_duration"]:
        durations[index(p.at_ms)].append(p.value)
    for p in points["errors"]:
        errors[index(p.at_ms)] += p.value > 0
    for p in points["cold_ms"]:
        cold[index(p.at_ms)] += 1
    last = max([*durations, *errors, *cold], default=-1)
    return [Bin(i * width_s, len(durations[i]), errors[i], percentile(durations[i], 50),
                percentile(durations[i], 95), percentile(durations[i], 99), cold[i])
            for i in range(last + 1)]


def summarize(scenario: str, tool: str, points: dict[str, list[Point]],
              machines: Sequence[MachineCount], export: dict[str, Any],
              load_s: float) -> Summary:
    """The run's figures: the tool's own from `export` (its verdict), else computed from
    `points` (the rate over `load_s`, the seconds the tool ran)."""
    def figure(metric: str, stat: str, otherwise: float) -> float:
        found = tool_figure(export, metric, stat)
        return otherwise if found is None else found

    durations = [p.value for p in points["http_req_duration"]]
    requests = int(figure("http_reqs", "count", len(durations)))
    started = [count for _, count in machines_in(machines, "started")]
    return Summary(
        scenario=scenario, tool=tool, requests=requests,
        errors=int(figure("errors", "passes", sum(p.value > 0 for p in points["errors"]))),
        rps=figure("http_reqs", "rate", requests / load_s if load_s > 0 else 0.0),
        p50_ms=figure("http_req_duration", "med", percentile(durations, 50)),
        p95_ms=figure("http_req_duration", "p(95)", percentile(durations, 95)),
        p99_ms=figure("http_req_duration", "p(99)", percentile(durations, 99)),
        cold=int(figure("cold_requests", "count", len(points["cold_ms"]))),
        hold_p99_ms=figure("hold_ms", "p(99)",
                           percentile([p.value for p in points["hold_ms"]], 99)),
        cold_p99_ms=figure("cold_ms", "p(99)",
                           percentile([p.value for p in points["cold_ms"]], 99)),
        machines_max=max(started, default=0), thresholds=tuple(parse_thresholds(export)),
    )


def summary_table(summary: Summary) -> str:
    """The run as markdown: one row of figures, then every threshold with its result."""
    verdict = ("pass" if summary.passed else "FAIL") if summary.thresholds else "none read"
    header = ("| scenario | tool | requests | errors | req/s | p50 ms | p95 ms | p99 ms | cold "
              "| hold p99 ms | cold p99 ms | machines max | thresholds |")
    row = (f"| {summary.scenario} | {summary.tool} | {summary.requests:,} | {summary.errors:,} "
           f"| {summary.rps:,.1f} | {summary.p50_ms:.1f} | {summary.p95_ms:.1f} "
           f"| {summary.p99_ms:.1f} | {summary.cold:,} | {summary.hold_p99_ms:.1f} "
           f"| {summary.cold_p99_ms:.1f} | {summary.machines_max} | {verdict} |")
    lines = [header, "|" + "---|" * 13, row, "", "| threshold | result |", "|---|---|"]
    lines += [f"| `{t.metric}: {t.expression}` | {'pass' if t.ok else 'FAIL'} |"
              for t in summary.thresholds]
    return "\n".join(lines) + "\n"


def report_markdown(summary: Summary, command: str, events: Sequence[Event], origin_ms: float,
                    parameters: dict[str, str], exit_code: int) -> str:
    """summary.md: the command, the table, what happened when, and the parameters."""
    lines = [f"# thaw loadtest {summary.scenario} ({summary.tool})", "", "```",
             command, "```", "", summary_table(summary),
             f"Exit status {exit_code}. The figures are {summary.tool}'s own summary. "
             "req/s: requests over the whole run as the tool timed it (k6's http_reqs "
             "rate; the plot's bars are requests per bin). Latency: the whole request, "
             "cold ones included; hold and cold: requests the edge held for a wake "
             "(Server-Timing). Machines: the largest number started at once in the "
             "samples of placement's API.",
             ""]
    if events:
        lines += ["| at s | event |", "|---|---|"]
        lines += [f"| {(e.at_ms - origin_ms) / 1000.0:.1f} | {e.label} |" for e in events]
        lines.append("")
    lines += ["Parameters (the environment both tools read):", "", "```"]
    lines += [f"{key}={value}" for key, value in sorted(parameters.items())]
    lines += ["```", "", "![plot](plot.png)", ""]
    return "\n".join(lines)
