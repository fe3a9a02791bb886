"""Noticing that the shared view was lost: the registry's generation changed.

Every service that publishes something of its own (placement its apps, an agent its
worker, layers and machines) keeps the generation it last published under; when the
registry answers another one, the view was lost (Redis restarted empty, or flushed)
and it publishes everything again. The edge keeps its view instead of trusting an
empty registry.
"""

from __future__ import annotations


class GenerationWatch:
    """The generation last published under. `lost(token)` says whether `token` is a new
    one after a known one; `published(token)` records it once everything is out again
    (a republish that failed half-way is tried again at the next check)."""

    def __init__(self) -> None:
        self.known: str | None = None

    def lost(self, token: str) -> bool:
        return self.known is not None and token != self.known

    def published(self, token: str) -> None:
        self.known = token


def view_whole(marker: str, generation: str, lost_at: float, now: float,
               bound_s: float) -> bool:
    """After a loss seen at `lost_at` (seconds, any clock `now` shares): whether a reader
    of the registry may take it as whole again and drop what it lacks. Yes once a
    placement has marked `generation` republished (`marker`: the registry's
    `republished()`), or once `bound_s` has passed without it (no placement is there to
    say so: what is gone must still go some time)."""
    return marker == generation or now >= lost_at + bound_s
