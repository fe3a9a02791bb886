"""Predicted start: how long until a machine a wake starts is ready, and so the wake.

One machine's start is its pull plus its boot. The pull is the bytes of its image
that its worker lacks (`missing_layer_bytes`, as the market scores them) over that
worker's measured pull rate (the EWMA its heartbeat carries), or `default_bytes_per_s`
when it has measured none; a stopped or suspended machine reused has its image
already: no pull. The boot is the app's history (an EWMA of the boot spans its
machines' events showed: cold boots and resumes kept apart), or a default before any.
Starts already in flight on the same worker share its CPU and disk: each stretches
the boot by `CONTENTION_PER_START` of itself (a linear model: two starts at once take
about 1.5 times as long each). A machine already `starting` (an earlier wake's, still
booting) is predicted ready at once: how far along it is, is unknown.

A wake's prediction is its earliest machine's: nothing the wake starts can take a
request sooner. It counts from the wake's receipt, including the time it took to
decide. Unknowns lean low (fast defaults, an in-flight start at 0), because a
prediction too high refuses requests that would have been served, while one too low
only holds them as before.

It must not know about HTTP, agents or clocks: times are arguments, in ms.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from placement.core.market import missing_layer_bytes
from thaw.registry.types import WorkerStatus

StartKind = Literal["new", "boot", "resume", "starting"]
# new: placed now, pulled, booted; boot: a stopped (or never started) machine started
# again; resume: a suspended one; starting: an earlier start still under way.

DEFAULT_BOOT_MS = 300.0  # a process that listens at once; the first boot of an app corrects it
DEFAULT_RESUME_MS = 20.0  # SIGCONT and a health check
CONTENTION_PER_START = 0.5
HISTORY_WEIGHT = 0.3  # of the newest boot span in an app's EWMA


def ewma(previous: float | None, sample: float, weight: float) -> float:
    """`sample` folded into `previous` (None: the first, taken whole), `weight` in (0, 1]."""
    return sample if previous is None else previous + weight * (sample - previous)


class BootHistory:
    """Each app's boot spans (ms) as an EWMA, cold boots and resumes apart."""

    def __init__(self, weight: float = HISTORY_WEIGHT) -> None:
        self.weight = weight
        self._ms: dict[tuple[str, bool], float] = {}

    def observe(self, app: str, resumed: bool, boot_ms: float) -> None:
        """A machine of `app` booted (or resumed) in `boot_ms`; 0 or less says nothing."""
        if boot_ms > 0:
            key = (app, resumed)
            self._ms[key] = ewma(self._ms.get(key), boot_ms, self.weight)

    def estimate(self, app: str, resumed: bool) -> float:
        """The app's expected boot (resume) in ms, or the default before any was seen."""
        seen = self._ms.get((app, resumed))
        if seen is not None:
            return seen
        return DEFAULT_RESUME_MS if resumed else DEFAULT_BOOT_MS

    def known(self, app: str, resumed: bool) -> bool:
        return (app, resumed) in self._ms

    def forget(self, app: str) -> None:
        self._ms.pop((app, False), None)
        self._ms.pop((app, True), None)


@dataclass(frozen=True)
class MachineForecast:
    """One machine's predicted start. `decided_ms`: when its worker was known (from the
    wake's receipt); `boot_ms` alone, before the contention of other starts is counted;
    `worker_starting`: starts in flight on its worker by its last heartbeat."""

    worker: str
    kind: StartKind
    decided_ms: float
    pull_ms: float
    boot_ms: float
    worker_starting: int = 0


def forecast_machine(
    kind: StartKind, worker: WorkerStatus, image_layers: Mapping[str, int], boot_ms: float,
    decided_ms: float, default_bytes_per_s: float,
) -> MachineForecast:
    """`boot_ms`: the app's expected boot (or resume) as history says; `image_layers`:
    digest -> bytes of the app's image (empty: unknown, no pull predicted)."""
    pull_ms = 0.0
    if kind == "new" and image_layers:
        rate = worker.pull_bytes_per_s if worker.pull_bytes_per_s > 0 else default_bytes_per_s
        pull_ms = missing_layer_bytes(worker, image_layers) / rate * 1000.0 if rate > 0 else 0.0
    if kind == "starting":
        boot_ms = 0.0
    return MachineForecast(worker.id, kind, decided_ms, pull_ms, boot_ms,
                           worker.machines_starting)


def start_ms(machine: MachineForecast, same_wake_on_worker: int) -> float:
    """When `machine` is predicted ready (ms from the wake's receipt); `same_wake_on_worker`:
    other machines of the same wake starting on its worker."""
    others = machine.worker_starting + same_wake_on_worker
    return (machine.decided_ms + machine.pull_ms
            + machine.boot_ms * (1.0 + CONTENTION_PER_START * others))


def wake_ms(machines: list[MachineForecast]) -> float | None:
    """The wake's prediction: its earliest machine (None: no machine was decided)."""
    if not machines:
        return None
    per_worker: dict[str, int] = {}
    for m in machines:
        per_worker[m.worker] = per_worker.get(m.worker, 0) + 1
    return min(start_ms(m, per_worker[m.worker] - 1) for m in machines)


class WakeForecast:
    """One wake's prediction, made as its `expected` machines' workers become known (slot
    by slot; a machine that failed before, `failed`): once all are in, the prediction is
    returned, exactly once. A slot reports once: a replacement placed after a decline
    (the prediction made already) changes nothing. Times: seconds on the caller's clock,
    `received` the wake's receipt; `workers`: the live workers by id (their heartbeats)."""

    def __init__(self, app: str, expected: int, workers: Mapping[str, WorkerStatus],
                 boots: BootHistory, default_bytes_per_s: float, received: float) -> None:
        self.app, self.expected, self.workers, self.boots = app, expected, workers, boots
        self.default_bytes_per_s = default_bytes_per_s
        self.received = received
        self.machines: list[MachineForecast] = []
        self.predicted_ms: float | None = None
        self.first_ready: float | None = None
        self._reported: set[int] = set()

    def decided(self, slot: int, kind: StartKind, worker: str, now: float,
                layers: Mapping[str, int] | None = None) -> float | None:
        """Machine `slot` (0 <= slot < expected) goes to `worker`, as `kind`; the wake's
        prediction (ms from its receipt) when this completes it, else None."""
        status = self.workers.get(worker)
        if status is None:  # (gone since the plan: nothing to say of it)
            return self.failed(slot)
        boot_ms = self.boots.estimate(self.app, resumed=kind == "resume")
        machine = forecast_machine(kind, status, layers or {}, boot_ms,
                                   (now - self.received) * 1000.0, self.default_bytes_per_s)
        return self._report(slot, machine)

    def failed(self, slot: int) -> float | None:
        """Machine `slot` ended before its worker was decided."""
        return self._report(slot, None)

    def _report(self, slot: int, machine: MachineForecast | None) -> float | None:
        if slot in self._reported or not 0 <= slot < self.expected:
            return None
        self._reported.add(slot)
        if machine is not None:
            self.machines.append(machine)
        if len(self._reported) < self.expected:
            return None
        self.predicted_ms = wake_ms(self.machines)
        return self.predicted_ms

    def ready(self, now: float) -> None:
        """A machine of the wake is ready (the first one counts)."""
        if self.first_ready is None:
            self.first_ready = now

    def measured(self) -> tuple[float, float]:
        """(predicted, actual first ready) in ms from the receipt, 0 where there is none:
        the figures the prediction's error is measured by."""
        predicted = self.predicted_ms or 0.0
        ready = 0.0 if self.first_ready is None else (self.first_ready - self.received) * 1000
        return round(predicted, 1), round(ready, 1)
