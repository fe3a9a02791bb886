"""Budgets on what an HTTP/2 client may send, checked on each frame's header before the
frame is acted on (edge/core/h2proto.py): the 2023-2024 floods end in GOAWAY
`ENHANCE_YOUR_CALM`.

- rapid reset (CVE-2023-44487): RST_STREAM frames per second, and the stream
  errors a client causes, which make the edge reset (CVE-2025-8671);
- CONTINUATION floods (CVE-2024-27316 family): CONTINUATION frames per header
  block, and the block's bytes (HPACK bombs grow from a small block, so the
  decoded size is bounded separately, by the header list size edge/core/hpack.py
  enforces);
- SETTINGS, PING, PRIORITY and WINDOW_UPDATE floods: frames per second each;
- empty DATA / HEADERS floods: frames with no payload and no END_STREAM in a
  row (Envoy's `max_consecutive_inbound_frames_with_empty_payload`).

Per-second budgets are token buckets: `rate` per second, bursts up to
`2 x rate`. `frame(kind, flags, length, now)` returns the reason a frame goes over
a budget, or None. No IO, no clock: `now` is an argument.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge.core.bucket import TokenBucket
from edge.core.h2wire import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PING,
    PRIORITY,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
)


@dataclass(frozen=True)
class Limits:
    resets_per_s: float = 100.0
    settings_per_s: float = 20.0
    pings_per_s: float = 20.0
    priority_per_s: float = 1000.0
    window_updates_per_s: float = 2000.0
    continuations_per_block: int = 16
    header_block_bytes: int = 65536
    empty_frames_in_a_row: int = 10


class FrameBudget:
    """One connection's frames, from the first byte after the client preface."""

    def __init__(self, limits: Limits, now: float = 0.0) -> None:
        self.limits = limits
        self._buckets = {
            RST_STREAM: TokenBucket(limits.resets_per_s, now),
            SETTINGS: TokenBucket(limits.settings_per_s, now),
            PING: TokenBucket(limits.pings_per_s, now),
            PRIORITY: TokenBucket(limits.priority_per_s, now),
            WINDOW_UPDATE: TokenBucket(limits.window_updates_per_s, now),
        }
        self._block_frames = -1  # CONTINUATIONs in the open header block (-1: none open)
        self._block_bytes = 0
        self._empty = 0  # empty frames in a row

    def stream_error(self, now: float) -> str | None:
        """A stream the client made us reset (a stream error): it spends the same budget as
        a reset the client sends, or a client could reset streams through us instead
        (CVE-2025-8671, "MadeYouReset")."""
        if self._buckets[RST_STREAM].take(now):
            return None
        return "too many stream resets per second (stream errors)"

    def frame(self, kind: int, flags: int, length: int, now: float) -> str | None:
        """The reason the frame (by its header) goes over a budget, or None."""
        limits = self.limits
        bucket = self._buckets.get(kind)
        if bucket is not None and not (kind == SETTINGS and flags & 0x1) \
                and not (kind == PING and flags & 0x1) and not bucket.take(now):
            names = {RST_STREAM: "stream resets", SETTINGS: "SETTINGS frames",
                     PING: "PING frames", PRIORITY: "PRIORITY frames",
                     WINDOW_UPDATE: "WINDOW_UPDATE frames"}
            return f"too many {names[kind]} per second"
        if kind == HEADERS:
            self._block_frames = -1 if flags & END_HEADERS else 0
            self._block_bytes = length
            if length > limits.header_block_bytes:
                return "a header block over its size limit"
        elif kind == CONTINUATION and self._block_frames >= 0:
            self._block_frames += 1
            self._block_bytes += length
            if self._block_frames > limits.continuations_per_block:
                return "too many CONTINUATION frames in one header block"
            if self._block_bytes > limits.header_block_bytes:
                return "a header block over its size limit"
            if flags & END_HEADERS:
                self._block_frames = -1
        if kind in (DATA, HEADERS, CONTINUATION) and length == 0 and not flags & END_STREAM:
            self._empty += 1
            if self._empty > limits.empty_frames_in_a_row:
                return "too many empty frames in a row"
        elif kind in (DATA, HEADERS):
            self._empty = 0
        return None
