"""Predicted start: how long until a machine a wake starts is ready, and so the wake.

One machine's start is its pull plus its boot. The pull is the bytes of its image
that its worker lacks (`missing_layer_bytes`, as the market scores them) over that
worker's measured pull rate (the EWMA of whole pulls its heartbeat carries: bytes
downloaded over the pull's time from resolve to unpacked), or `default_bytes_per_s`
when it has measured none; a stopped or suspended machine reused has its image
already: no pull. The boot is the app's history (an EWMA of its machines' boot spans,
each divided by the contention it was predicted to have, so the history holds
uncontended boots: cold boots and resumes kept apart), or a default before any.

Starts in flight on the same worker share its cores: a boot is stretched by
`contention_stretch` of the starts in flight when its worker is decided (the larger of
the worker's last heartbeat and this placement's own count): not at all while every
start can have a core, then as if the cores were shared evenly. A start is not
stretched by those decided after it (unknown then), so the first of a wake's machines
on one worker is predicted as if its siblings were not there. A machine already
`starting` (an earlier wake's, still booting) is predicted ready at once: how far along
it is, is unknown.

A wake's prediction is its earliest machine's: nothing the wake starts can take a
request sooner. It counts from the wake's receipt, including the time it took to
decide. Unknowns lean low (fast defaults, an in-flight start at 0, boots that do not
contend until the cores run out), because a prediction too high refuses requests that
would have been served, while one too low only holds them as before. So a first wake
of an app is predicted by `DEFAULT_BOOT_MS` whatever the app does: its real boot is
learnt from it, for the next wakes.

It must not know about HTTP, agents or clocks: times are arguments, in ms.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ground.registry.types import WorkerStatus
from placement.core.market import missing_layer_bytes

StartKind = Literal["new", "boot", "resume", "starting"]
# new: placed now, pulled, booted; boot: a stopped (or never started) machine started
# again; resume: a suspended one; starting: an earlier start still under way.

DEFAULT_BOOT_MS = 300.0  # a process that listens at once; the first boot of an app corrects it
DEFAULT_RESUME_MS = 20.0  # SIGCONT and a health check
HISTORY_WEIGHT = 0.3  # of the newest boot span in an app's EWMA


def ewma(previous: float | None, sample: float, weight: float) -> float:
    """`sample` folded into `previous` (None: the first, taken whole), `weight` in (0, 1]."""
    return sample if previous is None else previous + weight * (sample - previous)


def contention_stretch(others: int, cpus: float) -> float:
    """How many times its uncontended boot a start takes with `others` (>= 0) starts in
    flight on its worker of `cpus` CPUs: 1 while every start can have a core, then
    (1 + others) / cpus, the cores shared evenly. Between the two boots that sleep or
    wait on IO (no contention at all) and boots that burn CPU (a fair share of the
    cores), it assumes the first until the cores run out and the second after: low
    where unsure. A worker of less than one CPU counts as one: a start alone is its
    history, which was measured alone."""
    return max(1.0, (1 + others) / max(1.0, cpus))


class BootHistory:
    """Each app's uncontended boot spans (ms) as an EWMA, cold boots and resumes apart."""

    def __init__(self, weight: float = HISTORY_WEIGHT) -> None:
        self.weight = weight
        self._ms: dict[tuple[str, bool], float] = {}

    def observe(self, app: str, resumed: bool, boot_ms: float, stretch: float = 1.0) -> None:
        """A machine of `app` booted (or resumed) in `boot_ms`, under the contention
        `stretch` (>= 1, as `contention_stretch` predicted it for that start): the boot
        alone, `boot_ms / stretch`, is kept, so that a prediction stretches it once.
        A span of 0 or less says nothing."""
        if boot_ms > 0:
            key = (app, resumed)
            self._ms[key] = ewma(self._ms.get(key), boot_ms / max(1.0, stretch), self.weight)

    def estimate(self, app: str, resumed: bool) -> float:
        """The app's expected boot (resume) in ms alone, or the default before any was seen."""
        seen = self._ms.get((app, resumed))
        if seen is not None:
            return seen
        return DEFAULT_RESUME_MS if resumed else DEFAULT_BOOT_MS

    def known(self, app: str, resumed: bool) -> bool:
        return (app, resumed) in self._ms

    def forget(self, app: str) -> None:
        """The app is gone: an app made later under its name starts from the defaults."""
        self._ms.pop((app, False), None)
        self._ms.pop((app, True), None)


class StartsInFlight:
    """The starts this placement has in flight, per worker: counted from when a machine's
    worker is decided until its start ends. Wakes that arrive together see each other
    here before any heartbeat shows them."""

    def __init__(self) -> None:
        self._on: Counter[str] = Counter()

    def on(self, worker: str) -> int:
        return self._on[worker]

    def began(self, worker: str) -> None:
        self._on[worker] += 1

    def ended(self, worker: str) -> None:
        """One start on `worker` ended (one that never began is ignored)."""
        if self._on[worker] <= 1:
            del self._on[worker]
        else:
            self._on[worker] -= 1


@dataclass(frozen=True)
class MachineForecast:
    """One machine's predicted start. `decided_ms`: when its worker was known (from the
    wake's receipt); `boot_ms`: its boot alone; `stretch`: the contention of the starts
    in flight on its worker then (`contention_stretch`, 1 for none)."""

    worker: str
    kind: StartKind
    decided_ms: float
    pull_ms: float
    boot_ms: float
    stretch: float = 1.0


def forecast_machine(
    kind: StartKind, worker: WorkerStatus, image_layers: Mapping[str, int], boot_ms: float,
    decided_ms: float, default_bytes_per_s: float, starting_here: int = 0,
) -> MachineForecast:
    """`boot_ms`: the app's expected boot (or resume) alone, as history says;
    `image_layers`: digest -> bytes of the app's image (empty: unknown, no pull
    predicted); `starting_here`: starts this placement has in flight on the worker (the
    heartbeat's `machines_starting` may count them already, or not yet: the larger of
    the two is taken)."""
    pull_ms = 0.0
    if kind == "new" and image_layers:
        rate = worker.pull_bytes_per_s if worker.pull_bytes_per_s > 0 else default_bytes_per_s
        pull_ms = missing_layer_bytes(worker, image_layers) / rate * 1000.0 if rate > 0 else 0.0
    if kind == "starting":
        return MachineForecast(worker.id, kind, decided_ms, pull_ms, 0.0)
    others = max(worker.machines_starting, starting_here)
    return MachineForecast(worker.id, kind, decided_ms, pull_ms, boot_ms,
                           contention_stretch(others, worker.cpus))


def start_ms(machine: MachineForecast) -> float:
    """When `machine` is predicted ready (ms from the wake's receipt)."""
    return machine.decided_ms + machine.pull_ms + machine.boot_ms * machine.stretch


def wake_ms(machines: list[MachineForecast]) -> float | None:
    """The wake's prediction: its earliest machine (None: no machine was decided)."""
    return min((start_ms(m) for m in machines), default=None)


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

    def machine(self, kind: StartKind, worker: str, now: float,
                layers: Mapping[str, int] | None = None,
                starting_here: int = 0) -> MachineForecast | None:
        """A machine of the wake going to `worker` as `kind`, decided at `now`, with
        `starting_here` starts of this placement in flight there already (None: the
        worker is gone since the plan, nothing to say of it)."""
        status = self.workers.get(worker)
        if status is None:
            return None
        boot_ms = self.boots.estimate(self.app, resumed=kind == "resume")
        return forecast_machine(kind, status, layers or {}, boot_ms,
                                (now - self.received) * 1000.0, self.default_bytes_per_s,
                                starting_here)

    def decided(self, slot: int, kind: StartKind, worker: str, now: float,
                layers: Mapping[str, int] | None = None,
                starting_here: int = 0) -> float | None:
        """Machine `slot` (0 <= slot < expected) goes to `worker`, as `kind`; the wake's
        prediction (ms from its receipt) when this completes it, else None."""
        return self.report(slot, self.machine(kind, worker, now, layers, starting_here))

    def failed(self, slot: int) -> float | None:
        """Machine `slot` ended before its worker was decided."""
        return self.report(slot, None)

    def report(self, slot: int, machine: MachineForecast | None) -> float | None:
        """Machine `slot`'s forecast (None: it failed before its worker was decided); the
        wake's prediction when this completes it, else None."""
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
