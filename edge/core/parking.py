"""Idle keep-alive connections, parked (issue 28: an idle connection's memory).

A connection that has been idle for a turn of its own watchdog gives up its parser,
its head reader and its timer (edge/adapters/http1.py `_park`) and is kept here with
the time it became idle; the shell's one sweep closes those idle `idle_timeout_s`,
as nginx keeps idle keep-alive connections on a list rather than each on a timer.
Reading again takes a connection out (`unpark`).

Kept in the order they were parked. A connection parks within `slack_s` (its
watchdog's period) of becoming idle, so once one is met that became idle later than
`slack_s` after the cutoff, every one after it is younger than the cutoff too: a sweep
costs the connections it closes plus one. Pure: the caller gives the times.
"""

from __future__ import annotations

from typing import Generic, TypeVar

K = TypeVar("K")


class Parking(Generic[K]):
    def __init__(self, idle_timeout_s: float, slack_s: float) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.slack_s = slack_s
        self.since: dict[K, float] = {}  # parked -> when it became idle (loop time)

    def __len__(self) -> int:
        return len(self.since)

    def park(self, key: K, idle_since: float) -> None:
        self.since.pop(key, None)  # (parked again: to the end, in parking order)
        self.since[key] = idle_since

    def unpark(self, key: K) -> None:
        self.since.pop(key, None)

    def expired(self, now: float) -> list[K]:
        """The connections idle `idle_timeout_s` by `now`, taken out."""
        cutoff = now - self.idle_timeout_s
        out: list[K] = []
        for key, since in self.since.items():
            if since <= cutoff:
                out.append(key)
            elif since - self.slack_s > cutoff:
                break
        for key in out:
            del self.since[key]
        return out
