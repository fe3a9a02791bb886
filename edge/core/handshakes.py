"""The TLS door's handshakes: how many may be in progress at once, and when the memory
that failed ones leave behind is given back to the system.

A connection in its TLS handshake holds about 50 KB under uvloop (300 KB on the stdlib
loop, whose SSLProtocol zeroes a 256 KB read buffer), nearly all of it outside Python
objects: OpenSSL's state and buffers, the loop's. A handshake the client aborts (nothing
sent, part of a ClientHello, a close mid-handshake) frees all of it, but glibc keeps
freed heap pages, and later allocations land on pages of that heap never touched
before, so the edge's RSS only climbs, towards its heap's high-water mark (issue 26:
91 -> 766 MB).

Two bounds. At most `limit` handshakes in progress: a connection accepted past it is
closed before any TLS state is made for it. And once TRIM_AFTER_FAILED handshakes have
failed since the last trim, the shell trims (malloc_trim) TRIM_DELAY_S later, so the
burst's last connections are freed by then, and trims at most once per TRIM_DELAY_S
however long a flood lasts (a trim of a few hundred MB takes tens of ms). A trim during
which more handshakes failed is followed by another TRIM_DELAY_S later, whatever their
number, so a burst that goes on past a trim ends with one: otherwise the up to
TRIM_AFTER_FAILED - 1 that fail just after it (300 KB each on the stdlib loop) would keep
their memory. A few failures after a quiet spell are not worth a trim: what they keep is
bounded by what they used.

Pure: no IO and no clock; the shell (edge/adapters/tls.py) accepts, closes, arms the
timer and trims.
"""

from __future__ import annotations

from dataclasses import dataclass

TRIM_AFTER_FAILED = 100  # failed handshakes since the last trim that make a burst
TRIM_DELAY_S = 5.0  # from the burst's TRIM_AFTER_FAILED-th failure to the trim


@dataclass
class Handshakes:
    """The handshakes in progress at one TLS door. `limit` >= 1."""

    limit: int
    in_progress: int = 0
    refused: int = 0  # connections closed at the limit, since the start
    failed_since_trim: int = 0
    trim_armed: bool = False
    failed_while_armed: int = 0  # failed since the armed trim was armed

    def admit(self) -> bool:
        """A connection was accepted: True if its handshake may start (it is in progress
        until `ended`), False if `limit` are in progress (close it at once)."""
        if self.in_progress >= self.limit:
            self.refused += 1
            return False
        self.in_progress += 1
        return True

    def ended(self, done: bool) -> bool:
        """An admitted handshake ended, `done` or failed. True: arm the trim, TRIM_DELAY_S
        from now."""
        self.in_progress -= 1
        if done:
            return False
        self.failed_since_trim += 1
        if self.trim_armed:
            self.failed_while_armed += 1
            return False
        if self.failed_since_trim < TRIM_AFTER_FAILED:
            return False
        self.trim_armed = True
        return True

    def trimmed(self) -> bool:
        """The armed trim was carried out. True: arm the next, TRIM_DELAY_S from now
        (handshakes failed while this one waited: the burst may still be going on)."""
        again = self.failed_while_armed > 0
        self.failed_since_trim = 0
        self.failed_while_armed = 0
        self.trim_armed = again
        return again
