"""When to restart a crashed machine, and when to give up.

Decides, from the times of recent unasked exits, either a restart after an
exponential backoff or `failed` (a crash loop). Invariants: the delay never
exceeds `max_delay_s`; more than `max_crashes` within `window_s` gives up. It
must not know about processes or clocks: `now` and the history are arguments.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    base_delay_s: float = 0.1
    max_delay_s: float = 10.0
    max_crashes: int = 5
    window_s: float = 60.0


@dataclass(frozen=True)
class Restart:
    delay_s: float


@dataclass(frozen=True)
class GiveUp:
    reason: str


def after_crash(policy: RestartPolicy, crashes: list[float], now: float) -> Restart | GiveUp:
    """`crashes` are earlier crash times (not counting this one), in seconds."""
    recent = [t for t in crashes if now - t <= policy.window_s]
    if len(recent) + 1 > policy.max_crashes:
        return GiveUp(f"crashed {len(recent) + 1} times in {policy.window_s:g}s")
    delay = policy.base_delay_s * (2 ** len(recent))
    return Restart(min(delay, policy.max_delay_s))
