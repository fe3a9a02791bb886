"""What the edge counts, as plain values: the shell adds to them, /metrics reads them.

A `Histogram` keeps one count per bucket and a sum. `observe` adds 1 to the first
bucket whose upper bound is at least the value (Prometheus' `le`: bucket i holds
values in (bounds[i-1], bounds[i]]), and the last bucket, +Inf, holds values above
every bound. Counts are per bucket, not cumulative, so an observation is a scan
to its bucket and two updates; `cumulative` makes Prometheus' view when
it is scraped. `AppStats` is everything counted for one app. It lives on the app's
entry in the view (edge/view.py), so the series of an app go when the view drops
the app: nothing has to be forgotten, and a late update lands on a dropped entry.

Must not know: prometheus_client, clocks, the view.
"""

from __future__ import annotations

# Seconds. A warm request through the edge takes ~0.3 ms; a held one up to its hold
# timeout (60 s at most by AppConfig's bounds).
REQUEST_SECONDS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
)
# Seconds of holds, wake calls and wake phases (milliseconds to a minute).
WAKE_SECONDS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
PHASES = ("place", "pull", "boot")


class Histogram:
    """Counts per bucket of `bounds` (ascending upper bounds, +Inf implied) and a sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts: list[int] = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # From the lowest bucket up: most values (a warm request's) end in the first few,
        # where this beats a bisect call from compiled code.
        i = 0
        for bound in self.bounds:
            if value <= bound:
                break
            i += 1
        self.counts[i] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def add(self, other: Histogram) -> None:
        """Add `other`'s observations (same bounds) to these."""
        for i, n in enumerate(other.counts):
            self.counts[i] += n
        self.sum += other.sum

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus' buckets: (le, observations <= le), ending with ("+Inf", count)."""
        buckets = []
        running = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            running += n
            buckets.append((_le(bound), running))
        buckets.append(("+Inf", running + self.counts[-1]))
        return buckets


def _le(bound: float) -> str:
    """A bound as Prometheus clients write it (1.0, 0.005, 60.0)."""
    return repr(float(bound))


def code_class(status: int) -> str:
    """"2xx" for 200..299 and so on; a WebSocket tunnel (101) is "1xx"."""
    return f"{status // 100}xx" if 100 <= status <= 599 else "other"


class AppStats:
    """What the edge counted for one app: answers by status (with their durations),
    holds, wake calls and their phases, wakes by result, failed connects, auto-stops."""

    __slots__ = ("autostops", "connect_errors", "hold", "phases", "responses", "wake",
                 "wakes")

    def __init__(self) -> None:
        self.responses: dict[int, Histogram] = {}  # status -> durations (s)
        self.hold = Histogram(WAKE_SECONDS)  # seconds a request was held (released or 504)
        self.wake = Histogram(WAKE_SECONDS)  # seconds a wake call took, any result
        self.phases: dict[str, Histogram] = {}  # place|pull|boot -> placement's timings (s)
        self.wakes: dict[str, int] = {}  # result (ok or placement's code) -> wakes
        self.connect_errors = 0  # connects to this app's machines that failed
        self.autostops: dict[str, int] = {}  # stopped|kept|error -> auto-stop calls

    def answered(self, status: int, seconds: float) -> None:
        """A request answered with `status` after `seconds` (the warm path: one lookup)."""
        histogram = self.responses.get(status)
        if histogram is None:
            histogram = self.responses[status] = Histogram(REQUEST_SECONDS)
        histogram.observe(seconds)

    def woke(self, result: str, seconds: float, phases_ms: tuple[float, float, float] | None
             ) -> None:
        """A wake call ended with `result` after `seconds`; `phases_ms` (place, pull,
        boot) when placement answered."""
        self.wake.observe(seconds)
        self.wakes[result] = self.wakes.get(result, 0) + 1
        if phases_ms is not None:
            for phase, ms in zip(PHASES, phases_ms, strict=True):
                histogram = self.phases.get(phase)
                if histogram is None:
                    histogram = self.phases[phase] = Histogram(WAKE_SECONDS)
                histogram.observe(ms / 1000.0)

    def autostopped(self, result: str) -> None:
        self.autostops[result] = self.autostops.get(result, 0) + 1

    def by_class(self) -> dict[str, Histogram]:
        """Durations by code class ("2xx", …), every status of a class added up."""
        classes: dict[str, Histogram] = {}
        for status, histogram in sorted(self.responses.items()):
            name = code_class(status)
            merged = classes.get(name)
            if merged is None:
                merged = classes[name] = Histogram(histogram.bounds)
            merged.add(histogram)
        return classes
