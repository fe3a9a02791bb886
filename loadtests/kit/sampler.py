"""Machines sampled from placement's API during a load test, on a thread.

Every `interval_s` one round asks `GET /v1/apps/{app}/machines` for each watched app and
appends one row per (app, state) to `machines.csv` (timestamp_ms, app, state, count), all
rows of a round with the round's time. An app whose listing fails in a round (its worker
just died, the API is slow) is left out of that round, not counted as zero machines.
"""

from __future__ import annotations

import csv
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
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

    def __enter__(self) -> MachineSampler:
        with open(self.path, "w", newline="") as out:
            csv.writer(out).writerow(MACHINE_COLUMNS)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def sample_once(self) -> list[MachineCount]:
        at_ms = self.clock() * 1000.0
        rows: list[MachineCount] = []
        for app in self.apps:
            try:
                states = Counter(str(m.get("state")) for m in self.lister.machines(app))
            except Exception:  # one round without this app, never the end of sampling
                continue
            states.pop("destroyed", None)
            rows += [MachineCount(at_ms, app, state, n) for state, n in sorted(states.items())]
            if not states:  # "no machine" is a value worth plotting
                rows.append(MachineCount(at_ms, app, "started", 0))
        with self._lock:
            self.samples += rows
        with open(self.path, "a", newline="") as out:
            csv.writer(out).writerows((f"{r.at_ms:.0f}", r.app, r.state, r.count) for r in rows)
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
