"""Wire types of placement that other services import (the edge's wake call)."""

from __future__ import annotations

import msgspec


class WakeRequest(msgspec.Struct, frozen=True):
    """`POST /internal/apps/{app}/wake`: start `count` machines within `deadline_ms`.

    `deadline_ms` is the budget left, in milliseconds, measured from receipt.
    `region` "" means the app's primary region.
    """

    count: int = 1
    deadline_ms: int = 30_000
    region: str = ""


class WokenMachine(msgspec.Struct, frozen=True):
    id: str
    address: str  # host:port, reachable now
    worker: str


class WakeTimings(msgspec.Struct, frozen=True):
    """Milliseconds spent, for Server-Timing: the slowest machine's figures."""

    place_ms: float = 0.0
    pull_ms: float = 0.0
    boot_ms: float = 0.0


class WakeResponse(msgspec.Struct, frozen=True):
    """200: at least one machine is ready. `shortfall` explains fewer than asked."""

    machines: list[WokenMachine]
    timings: WakeTimings = WakeTimings()
    shortfall: str = ""


# Error bodies are {"error": code, "message": text}. Codes and statuses:
WAKE_ERRORS = {
    "not_found": 404,  # unknown app
    "no_capacity": 503,  # no worker accepted an offer (Retry-After set)
    "start_failed": 503,  # a machine was placed but did not become ready
    "deadline": 504,  # the budget ran out first
}


class AutostopRequest(msgspec.Struct, frozen=True):
    """`POST /internal/apps/{app}/machines/{id}/autostop`: the edge saw it idle."""

    idle_s: float = 0.0
