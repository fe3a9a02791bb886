"""The SLOs of thaw's load scenarios, for the locustfile: what a request says about the
cold path, the tally of a run, and the verdict at its end. Pure: no Locust, no IO.

The same metrics as the k6 scenarios (loadtests/k6/lib/thaw.js): `errors` (any answer
but 2xx; a refused connection or a timeout is status 0), `warm_ms` (requests not held),
`cold_ms` and `hold_ms` (requests the edge held for a wake: it answers them with
`Server-Timing: hold;dur=…, place;dur=…, pull;dur=…, boot;dur=…`, in milliseconds), and
`summary_export` writes them in the shape of k6's `--summary-export`, so one report reads
either tool.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

TREND_STATS = ("avg", "min", "med", "p(95)", "p(99)", "max", "count")


def server_timing(header: str | None) -> dict[str, float]:
    """`hold;dur=12.5, place;dur=3.0` → {"hold": 12.5, "place": 3.0} (ms); entries without
    a readable `dur` are left out."""
    phases: dict[str, float] = {}
    for entry in (header or "").split(","):
        name, *params = (part.strip() for part in entry.split(";"))
        for param in params:
            if name and param.startswith("dur="):
                try:
                    phases[name] = float(param[4:])
                except ValueError:
                    pass
    return phases


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 to 100) by linear interpolation between the closest ranks, as
    k6's trends compute it; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def trend(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return dict.fromkeys(TREND_STATS, 0.0)
    return {"avg": sum(values) / len(values), "min": min(values),
            "med": percentile(values, 50), "p(95)": percentile(values, 95),
            "p(99)": percentile(values, 99), "max": max(values), "count": float(len(values))}


@dataclass(frozen=True)
class Slo:
    """The thresholds; a run passes when every one holds."""

    max_error_rate: float = 0.0  # errors / requests
    warm_p99_ms: float = 1000.0
    hold_p99_ms: float = 5000.0
    cold_p99_ms: float = 6000.0
    cold_expected: bool = False  # a cold scenario: at least one request must be cold


@dataclass(frozen=True)
class Verdict:
    metric: str
    expression: str  # in k6's threshold syntax, e.g. "p(99)<5000"
    observed: float
    ok: bool


@dataclass
class Tally:
    """Every answer of a run, by metric."""

    requests: int = 0
    errors: int = 0
    warm_ms: list[float] = field(default_factory=list)
    cold_ms: list[float] = field(default_factory=list)
    phases_ms: dict[str, list[float]] = field(default_factory=dict)  # hold, place, pull, boot

    def record(self, status: int, duration_ms: float, timing: dict[str, float]) -> None:
        self.requests += 1
        self.errors += not 200 <= status <= 299
        if "hold" in timing:
            self.cold_ms.append(duration_ms)
            for phase, ms in timing.items():
                self.phases_ms.setdefault(phase, []).append(ms)
        else:
            self.warm_ms.append(duration_ms)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def hold_ms(self) -> list[float]:
        return self.phases_ms.get("hold", [])


def evaluate(tally: Tally, slo: Slo) -> list[Verdict]:
    """One verdict per threshold, in the order the k6 scenarios declare them."""
    verdicts = [
        Verdict("errors", f"rate<={slo.max_error_rate:g}", tally.error_rate,
                tally.error_rate <= slo.max_error_rate),
        Verdict("warm_ms", f"p(99)<{slo.warm_p99_ms:g}", percentile(tally.warm_ms, 99),
                percentile(tally.warm_ms, 99) < slo.warm_p99_ms),
        Verdict("hold_ms", f"p(99)<{slo.hold_p99_ms:g}", percentile(tally.hold_ms, 99),
                percentile(tally.hold_ms, 99) < slo.hold_p99_ms),
        Verdict("cold_ms", f"p(99)<{slo.cold_p99_ms:g}", percentile(tally.cold_ms, 99),
                percentile(tally.cold_ms, 99) < slo.cold_p99_ms),
    ]
    if slo.cold_expected:
        cold = float(len(tally.cold_ms))
        verdicts.append(Verdict("cold_requests", "count>0", cold, cold > 0))
    return verdicts


def summary_export(tally: Tally, verdicts: Sequence[Verdict],
                   run_s: float) -> dict[str, Any]:
    """The run in the shape of k6's `--summary-export` JSON: per metric its values and
    `thresholds` as {expression: crossed}; the request rate over the run's `run_s`
    seconds, as k6 gives `http_reqs`."""
    metrics: dict[str, dict[str, Any]] = {
        "http_reqs": {"count": tally.requests,
                      "rate": tally.requests / run_s if run_s > 0 else 0.0},
        "errors": {"value": tally.error_rate, "passes": tally.errors,
                   "fails": tally.requests - tally.errors},
        "warm_ms": trend(tally.warm_ms),
        "cold_ms": trend(tally.cold_ms),
        "cold_requests": {"count": len(tally.cold_ms)},
        "http_req_duration": trend(tally.warm_ms + tally.cold_ms),
    }
    for phase, values in tally.phases_ms.items():
        metrics[f"{phase}_ms"] = trend(values)
    metrics.setdefault("hold_ms", trend([]))
    for verdict in verdicts:
        metrics[verdict.metric].setdefault("thresholds", {})[verdict.expression] = not verdict.ok
    return {"metrics": metrics}


def verdict_lines(verdicts: Sequence[Verdict]) -> list[str]:
    """The verdicts as lines for a terminal, k6-like: `✓ hold_ms p(99)<5000 (180.0)`."""
    return [f"{'✓' if v.ok else '✗'} {v.metric} {v.expression} (observed {v.observed:.4g})"
            for v in verdicts]
