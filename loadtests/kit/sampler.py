"""Machines sampled from placement's API during a load test, on a thread.

Every `interval_s` one round asks `GET /v1/apps/{app}/machines` for each watched app and
appends rows (timestamp_ms, app, state, count) to `machines.csv`. A machine that changed
state since the last round changed it at its `updated_at` (kept within the two rounds):
the round writes the counts of every app at each such instant, then at its own time, so
the series steps where the machines did, not up to a sampling interval later. A change
stamped at or before the last round (a listing that failed then, another host's clock,
no stamp) is counted from this round: the rows written then are never written again, so
no time has two sets of rows. An app
whose listing fails in a round (its worker just died, the API is slow) keeps the counts
last seen, never counted as zero machines.
"""

from __future__ import annotations

import csv
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from itertools import groupby
from pathlib import Path
from typing import Protocol

from loadtests.kit.report import MACHINE_COLUMNS, MachineCount


class MachineLister(Protocol):
    def machines(self, app: str) -> list[dict[str, object]]: ...


class MachineSampler:
    """Samples from entering (a first round at once) to leaving the `with` block."""

    def __init__(self, lister: MachineLister, apps: Sequence[str], path: Path,
                 interval_s: float = 0.5, clock: Callable[[], float] = time.time) -> None:
        self.lister = lister
        self.apps = list(apps)
        self.path = path
        self.interval_s = interval_s
        self.clock = clock
        self.samples: list[MachineCount] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="machine-sampler", daemon=True)
        self._lock = threading.Lock()
        self._states: dict[str, dict[str, str]] = {app: {} for app in self.apps}
        self._last_ms: float | None = None  # the last round's time
        self._listed: set[str] = set()  # apps listed at least once

    def __enter__(self) -> MachineSampler:
        with open(self.path, "w", newline="") as out:
            csv.writer(out).writerow(MACHINE_COLUMNS)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def sample_once(self) -> list[MachineCount]:
        now_ms = self.clock() * 1000.0
        since_ms = now_ms if self._last_ms is None else self._last_ms
        self._last_ms = now_ms
        changes = sorted(self._changes(since_ms, now_ms), key=lambda c: c[0])
        rows: list[MachineCount] = []
        for at_ms, group in groupby(changes, key=lambda c: c[0]):
            for _, app, machine, state in group:
                if state == "destroyed":
                    self._states[app].pop(machine, None)
                else:
                    self._states[app][machine] = state
            if since_ms < at_ms < now_ms:  # the last round's rows stand as written
                rows += self._counts(at_ms)
        rows += self._counts(now_ms)
        with self._lock:
            self.samples += rows
        with open(self.path, "a", newline="") as out:
            csv.writer(out).writerows((f"{r.at_ms:.0f}", r.app, r.state, r.count) for r in rows)
        return rows

    def _changes(self, since_ms: float, now_ms: float) -> list[tuple[float, str, str, str]]:
        """(when, app, machine, new state) for every machine that changed since the last
        round; a machine no longer listed was destroyed now."""
        changes = []
        for app in self.apps:
            try:
                listing = self.lister.machines(app)
            except Exception:  # this app's counts as last seen, never the end of sampling
                continue
            self._listed.add(app)
            known = self._states[app]
            listed = set()
            for i, machine in enumerate(listing):
                name, state = str(machine.get("id", i)), str(machine.get("state"))
                listed.add(name)
                if known.get(name, "destroyed") != state:
                    at_ms = float(machine.get("updated_at") or 0) * 1000.0  # type: ignore[arg-type]
                    changes.append((min(max(at_ms, since_ms), now_ms), app, name, state))
            changes += [(now_ms, app, name, "destroyed") for name in set(known) - listed]
        return changes

    def _counts(self, at_ms: float) -> list[MachineCount]:
        rows = []
        for app in filter(self._listed.__contains__, self.apps):  # apps never listed: unknown
            states = Counter(self._states[app].values())
            rows += [MachineCount(at_ms, app, state, n) for state, n in sorted(states.items())]
            if not states:  # "no machine" is a value worth plotting
                rows.append(MachineCount(at_ms, app, "started", 0))
        return rows

    def started_now(self) -> int:
        """Machines started in the last round (over every app)."""
        with self._lock:
            if not self.samples:
                return 0
            last = self.samples[-1].at_ms
            return sum(s.count for s in self.samples if s.at_ms == last and s.state == "started")

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.sample_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))
