"""How many machines a wake asks for, and whether a wake may start now.

`machines_to_start = ceil((in_flight + held) / soft_limit) - (started +
starting)`, capped by `max_machines - (started + starting)`, never below 0.
Single flight: while one wake of an app is in flight no other starts; when it
returns the shell asks again, so a burst starts exactly the machines it needs
(1,000 requests at soft_limit 20 start 50, not 1,000 and not 1). It knows
nothing of HTTP or placement: counts in, a count out.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AppLoad:
    """Counts of one app at one instant, from the edge's view."""

    in_flight: int
    held: int
    started: int
    starting: int
    soft_limit: int
    max_machines: int
    wake_in_flight: bool = False


def machines_to_start(load: AppLoad) -> int:
    """The machines to ask placement for now; 0 when none are needed or allowed."""
    if load.soft_limit <= 0:
        raise ValueError("soft_limit must be > 0")
    demand = load.in_flight + load.held
    have = load.started + load.starting
    needed = -(-demand // load.soft_limit) - have
    room = load.max_machines - have
    return max(0, min(needed, room))


def next_wake(load: AppLoad) -> int:
    """Single-flight gate over `machines_to_start`: 0 while a wake is in flight."""
    if load.wake_in_flight or load.held == 0:
        return 0
    return machines_to_start(load)
