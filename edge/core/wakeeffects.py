"""One wake of an app as the edge sees it, and the effects the cold path's policy
(edge/core/appwake.py) returns for the shell to carry out.

Each released request carries the `Wake` that produced the machine it goes to
(None when it went to room left by another request): its place, pull and
boot figures are what `Server-Timing` says. A machine seen in the registry
feed before placement's answer gives the wake a first estimate (boot from the
worker's own events; the rest of the time since the wake was sent counted as
place, pull folded in) that the answer replaces.

Pure: no HTTP, sockets or clocks (`now` is an argument).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


class Wake:
    """One call to placement for an app, and what came of it (ms figures)."""

    __slots__ = ("answered", "app", "boot_ms", "count", "first_machine_at", "machine_at",
                 "place_ms", "predicted_at", "pull_ms", "sent_at")

    def __init__(self, app: str, count: int, sent_at: float) -> None:
        self.app = app
        self.count = count
        self.sent_at = sent_at
        self.machine_at = -1.0  # when a machine of this wake last appeared (-1: none yet)
        self.first_machine_at = -1.0  # ... and first
        self.predicted_at = -1.0  # when its first machine is predicted ready (-1: unknown)
        self.answered = False
        self.place_ms = self.pull_ms = self.boot_ms = 0.0

    def predicted_wait_s(self, now: float) -> float:
        """Seconds until its first machine is predicted ready (0: none predicted, or past)."""
        return max(0.0, self.predicted_at - now) if self.predicted_at >= 0 else 0.0

    def measured_ms(self) -> tuple[float, float]:
        """(predicted, actual) ms from sending to its first machine ready; -1: unknown."""
        predicted = (self.predicted_at - self.sent_at) * 1000 if self.predicted_at >= 0 else -1
        ready = -1.0
        if self.first_machine_at >= 0:
            ready = (self.first_machine_at - self.sent_at) * 1000
        return predicted, ready

    def _seen(self, now: float) -> None:
        self.machine_at = now
        if self.first_machine_at < 0:
            self.first_machine_at = now

    def machine_seen(self, now: float, boot_ms: float | None) -> None:
        """A machine appeared while this wake was in flight (placement had not answered)."""
        self._seen(now)
        if not self.answered:
            elapsed_ms = max(0.0, (now - self.sent_at) * 1000.0)
            self.boot_ms = min(boot_ms or 0.0, elapsed_ms)
            self.place_ms = elapsed_ms - self.boot_ms  # pull, if any, folded in
            self.pull_ms = 0.0

    def answer(self, now: float, place_ms: float, pull_ms: float, boot_ms: float) -> None:
        self.answered = True
        self._seen(now)
        self.place_ms, self.pull_ms, self.boot_ms = place_ms, pull_ms, boot_ms


def server_timing(hold_s: float, wake: Wake | None) -> bytes:
    """`hold;dur=X, place;dur=Y, pull;dur=Z, boot;dur=W` in milliseconds (a request that
    went to room another left, with no wake to credit, says 0 for the wake's phases)."""
    if wake is None:
        return b"hold;dur=%.1f, place;dur=0.0, pull;dur=0.0, boot;dur=0.0" % (hold_s * 1000.0)
    return b"hold;dur=%.1f, place;dur=%.1f, pull;dur=%.1f, boot;dur=%.1f" % (
        hold_s * 1000.0, wake.place_ms, wake.pull_ms, wake.boot_ms)


# -- effects -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CallPlacement:
    """Ask placement for `count` machines of `app` within `deadline_ms`, saying `demand`
    (requests held or in flight here: placement sums every edge's); report the answer
    with `on_wake_answer(wake, ...)` or `on_wake_failed(wake, ...)`."""

    app: str
    count: int
    deadline_ms: int
    wake: Wake
    demand: int = 0


@dataclass(frozen=True)
class Released(Generic[T]):
    item: T
    hold_s: float
    wake: Wake | None  # the wake whose machine freed it, if one did


@dataclass(frozen=True)
class Release(Generic[T]):
    """Forward these held requests now, oldest first; the app's machines can take them."""

    app: str
    items: list[Released[T]]


@dataclass(frozen=True)
class Fail(Generic[T]):
    """Answer these held requests with `code` (`waits`: seconds each was held)."""

    app: str
    items: list[T]
    waits: list[float]
    code: str
    detail: str


@dataclass(frozen=True)
class Shed(Generic[T]):
    """Answer these held (or arriving) requests 503 `predicted_late` now, with Retry-After
    `retry_after_s`: the app's machine is predicted ready after their deadlines
    (`waits`: seconds each was held; `wait_s`: the predicted wait)."""

    app: str
    items: list[T]
    waits: list[float]
    retry_after_s: int
    wait_s: float


@dataclass(frozen=True)
class ArmTimer:
    """Call `on_timer(token, ...)` at `at` (None: no timer is wanted); replaces the last."""

    token: str
    at: float | None


Effect = CallPlacement | Release[T] | Fail[T] | Shed[T] | ArmTimer


def shed(app: str, items: list[T], waits: list[float], wake: Wake, now: float) -> Shed[T]:
    """`items` shed for `wake`'s prediction: Retry-After is the predicted wait, rounded up
    (at least 1 s)."""
    wait_s = wake.predicted_wait_s(now)
    return Shed(app, items, waits, max(1, math.ceil(wait_s)), wait_s)
