"""A token bucket: `rate` tokens a second, up to a burst of `burst` (twice the rate unless
given; pure: the time is an argument). Every per-second budget of the edge is one: HTTP/2
frames per connection (h2budget), connections and resets per client (clients), 499 lines
in the access log."""

from __future__ import annotations


class TokenBucket:
    __slots__ = ("at", "burst", "rate", "tokens")

    def __init__(self, rate: float, now: float = 0.0, burst: float | None = None) -> None:
        self.rate = rate
        self.burst = 2.0 * rate if burst is None else burst
        self.tokens = self.burst
        self.at = now

    def take(self, now: float) -> bool:
        """Spend one token if there is one (refilled for the time since the last take)."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True
