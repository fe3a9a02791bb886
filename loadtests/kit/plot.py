"""The report's picture: request rate, latency percentiles and machines over one time
axis (matplotlib, Agg backend), with the driver's events (a deploy, a kill, the end of the
load) as vertical lines across all three."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtests.kit.report import (
    STANDBY,
    Bin,
    Event,
    MachineCount,
    Point,
    bin_width_s,
    bins,
    machines_in,
)

FLEET_LINES = (("started", ("started",), "-"), ("starting", ("starting",), "--"),
               ("standing by (created, stopped, suspended)", STANDBY, ":"))


def plot(path: Path, title: str, points: dict[str, list[Point]],
         machines: Sequence[MachineCount], events: Sequence[Event], origin_ms: float) -> None:
    """Write the PNG; time runs from `origin_ms` (unix ms), the start of the load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ends = [*(p.at_ms for p in points["http_req_duration"]), *(s.at_ms for s in machines),
            *(e.at_ms for e in events)]
    width = bin_width_s((max(ends, default=origin_ms) - origin_ms) / 1000.0)
    series = bins(points, origin_ms, width)
    fig, (rate, latency, fleet) = plt.subplots(3, 1, figsize=(12.5, 8.5), sharex=True,
                                               height_ratios=[1, 1.3, 1])
    rate_panel(rate, series, width)
    latency_panel(latency, series, width, points["cold_ms"], origin_ms)
    fleet_panel(fleet, machines, origin_ms)
    for axis in (rate, latency, fleet):
        for event in events:
            axis.axvline((event.at_ms - origin_ms) / 1000.0, color="black", linestyle="--",
                         linewidth=0.8)
        axis.grid(alpha=0.3)
        # beside the panel, where it covers no bar, line or event label
        axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
                    fontsize=8)
    for event in events:
        rate.annotate(event.label, ((event.at_ms - origin_ms) / 1000.0, 1.0),
                      xycoords=("data", "axes fraction"), fontsize=8,
                      xytext=(3, -12), textcoords="offset points")
    if events:  # room right of the last event line for its label
        left, right = fleet.get_xlim()
        last = max((e.at_ms - origin_ms) / 1000.0 for e in events)
        fleet.set_xlim(left, max(right, last + 0.1 * (right - left)))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rate_panel(axis: Any, series: Sequence[Bin], width: float) -> None:
    x = [b.start_s for b in series]
    axis.bar(x, [b.requests / width for b in series], width=width, align="edge",
             color="#7a9cc6", label="requests/s")
    axis.bar(x, [b.errors / width for b in series], width=width, align="edge",
             color="#d62728", label="errors/s")
    axis.set_ylabel(f"requests/s\nin {width:g} s bins")
    top = max((b.requests / width for b in series), default=0.0)
    axis.set_ylim(0, max(top, 1.0) * 1.25)  # room above the bars for the events' labels


def latency_panel(axis: Any, series: Sequence[Bin], width: float, cold: Sequence[Point],
                  origin_ms: float) -> None:
    mid = [b.start_s + width / 2 for b in series]
    for name, color in (("p50_ms", "#2ca02c"), ("p95_ms", "#ff7f0e"), ("p99_ms", "#d62728")):
        # an empty bin is a gap in the line, not a slope across it
        values = [getattr(b, name) if b.requests else math.nan for b in series]
        axis.plot(mid, values, color=color, label=name.replace("_ms", ""), linewidth=1.4,
                  marker="." if len(series) < 30 else None)
    if cold:
        axis.scatter([(p.at_ms - origin_ms) / 1000.0 for p in cold], [p.value for p in cold],
                     s=6, color="#9467bd", alpha=0.5, label="cold requests")
    shown = [b.p50_ms for b in series if b.requests] + [b.p99_ms for b in series if b.requests]
    shown += [p.value for p in cold]
    if shown and min(shown) > 0 and max(shown) / min(shown) > 10:
        axis.set_yscale("log")  # warm and cold together: decades apart
    else:
        axis.set_ylim(0, max(shown, default=1.0) * 1.15)  # one kind: a plain axis from 0
    axis.set_ylabel("latency, ms")


def fleet_panel(axis: Any, machines: Sequence[MachineCount], origin_ms: float) -> None:
    for label, states, style in FLEET_LINES:
        counts = machines_in(machines, *states)
        if counts and (label == "started" or any(c for _, c in counts)):
            axis.step([(at - origin_ms) / 1000.0 for at, _ in counts], [c for _, c in counts],
                      where="post", linestyle=style, linewidth=2 if label == "started" else 1,
                      label=f"machines {label}")
    peak = max((c for _, c in machines_in(machines, "started", "starting", *STANDBY)),
               default=0)
    axis.set_ylim(0, max(peak, 1) * 1.15 + 0.5)  # from zero: a constant count is a line
    axis.set_ylabel("machines")
    axis.set_xlabel("seconds from the start of the load")
    axis.yaxis.get_major_locator().set_params(integer=True)
