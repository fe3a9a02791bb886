"""Which ends of an app's machines are news: crashes and failures its owner is to see
among the app's events (`thaw events`), each once.

A machine's own events (from its agent) carry the reason its process ended (`oom`,
`exited(3)`, a crash loop with its last output). The reconciler sees them each pass;
this decides which it has not noted yet, by a watermark per machine (the time of the
last event noted). A machine seen for the first time notes nothing of its past: a
placement that takes an app over (a restart, a lease moving) does not repeat what the
previous holder noted. It must not know about the store or the clock.
"""

from __future__ import annotations

from dataclasses import dataclass

TOLD = frozenset({"crash", "fail"})


@dataclass(frozen=True)
class MachineEnd:
    machine: str
    at: float
    event: str  # crash | fail
    reason: str


def new_ends(events: dict[str, list[tuple[float, str, str]]], seen: dict[str, float]
             ) -> tuple[list[MachineEnd], dict[str, float]]:
    """`events`: machine -> its events as (at, event, reason), oldest first; `seen`:
    machine -> the last event time noted. Returns the ends to note, oldest first, and the
    watermarks to keep (machines no longer present are dropped)."""
    ends: list[MachineEnd] = []
    marks: dict[str, float] = {}
    for machine, history in events.items():
        newest = max((at for at, _, _ in history), default=0.0)
        if machine not in seen:
            marks[machine] = newest
            continue
        ends += [MachineEnd(machine, at, event, reason) for at, event, reason in history
                 if at > seen[machine] and event in TOLD]
        marks[machine] = max(newest, seen[machine])
    return sorted(ends, key=lambda end: end.at), marks
