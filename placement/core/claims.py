"""What this placement's wakes are starting, per app: the wake claims' rules, pure.

A wake that plans to start machines claims them: existing machines it restarts are
*claimed* (being started) from the plan on; a new machine is *placing* from the plan
until an agent has made it (or the placing failed), then claimed, until its start ends.
Other wakes plan around every placement's claims, so two wakes of one app start what
both asked for, not twice as many (placement/wakes/wakeclaims.py shares them).

Events in, effects out: each change returns the app whose published claims must follow
(`Changed`); the shell (placement/wakes/wakeclaims.py) publishes them, in order and coalesced.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Claims:
    placing: int = 0  # new machines being placed, not reported by an agent yet
    starting: frozenset[str] = frozenset()  # machines being started

    def plus(self, other: Claims) -> Claims:
        return Claims(self.placing + other.placing, self.starting | other.starting)


@dataclass(frozen=True)
class Changed:
    """The app's claims changed: what other placements see of them must follow."""

    app: str


class ClaimLedger:
    """This placement's claims, by app (no entry for an app with none)."""

    def __init__(self) -> None:
        self._claimed: dict[str, set[str]] = {}  # app -> machines a wake here is starting
        self._placing: Counter[str] = Counter()  # app -> new machines being placed here

    def of(self, app: str) -> Claims:
        return Claims(self._placing[app], frozenset(self._claimed.get(app, ())))

    def placing(self, app: str) -> int:
        return self._placing[app]

    def apps(self) -> set[str]:
        """Apps with any claim."""
        return {app for app, machines in self._claimed.items() if machines} | {
            app for app, count in self._placing.items() if count}

    def planned(self, app: str, reuse: Iterable[str], new: int) -> Changed:
        """A wake's plan: the existing machines it starts are claimed, and `new` machines
        are being placed."""
        machines = set(reuse)
        if machines:
            self._claimed.setdefault(app, set()).update(machines)
        self._placing[app] += new
        return Changed(app)

    def place_another(self, app: str) -> Changed:
        """One more new machine is being placed (a start declined: another in its stead)."""
        self._placing[app] += 1
        return Changed(app)

    def placed(self, app: str, machine: str | None) -> Changed:
        """A new machine's placing ended: it exists on an agent as `machine` (claimed
        until its start ends), or was never made (None)."""
        self._placing[app] -= 1
        if self._placing[app] <= 0:
            del self._placing[app]
        if machine is not None:
            self._claimed.setdefault(app, set()).add(machine)
        return Changed(app)

    def started(self, app: str, machine: str) -> Changed:
        """A claimed machine's start ended (ready, failed, or the wake answered first):
        a later wake that finds it still starting waits for it, unclaimed."""
        machines = self._claimed.get(app)
        if machines is not None:
            machines.discard(machine)
            if not machines:
                del self._claimed[app]
        return Changed(app)

    def withdraw(self) -> list[str]:
        """Every claim dropped (the placement stops): the apps whose claims were out."""
        apps = sorted(self.apps())
        self._claimed.clear()
        self._placing.clear()
        return apps
