"""Which idle machines the edge asks placement to stop (or suspend).

A machine is idle when it has no in-flight request and its last request
started at least `idle_timeout_s` ago (a machine that never served counts
from when the edge first saw it started). The longest idle go first, and never
so many that fewer than `min_machines_running` started machines remain.
`auto_stop == "off"` stops nothing. Draining machines are not counted as
running: they are already on their way out. It knows nothing of HTTP or time
sources; `now` is an argument in the same clock as `last_start`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class MachineActivity:
    id: str
    in_flight: int
    last_start: float  # last request start, or when the machine was first seen started
    draining: bool = False


def machines_to_stop(
    machines: Sequence[MachineActivity],
    auto_stop: str,
    idle_timeout_s: float,
    min_machines_running: int,
    now: float,
) -> list[str]:
    """Ids to stop, longest idle first."""
    if auto_stop == "off":
        return []
    running = [m for m in machines if not m.draining]
    spare = len(running) - max(0, min_machines_running)
    if spare <= 0:
        return []
    idle = [m for m in running if m.in_flight == 0 and now - m.last_start >= idle_timeout_s]
    idle.sort(key=lambda m: m.last_start)
    return [m.id for m in idle[:spare]]
