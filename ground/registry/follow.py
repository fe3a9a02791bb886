"""Following the registry's change feed: from a position, resumed after an error.

Every follower (the edge's view, placement's fleet index, the reconciler's
triggers) reads `changes(after=position)` and must not lose its place when the
registry is away: it keeps what it has, waits, reloads (the stream may have been
trimmed past its position, or lost with the registry) and resumes from the last
change it saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from ground.registry.types import ROUTES, Change, Feed

log = logging.getLogger("thaw.registry")

FEED_RETRY_S = 1.0


class ChangeFeed(Protocol):
    """The part of the registry a follower reads (`ground.registry.Registry` is one)."""

    def changes(self, after: str | None = None, block_s: float | None = None,
                feed: Feed = ROUTES) -> AsyncIterator[Change]: ...


class Cursor(Protocol):
    """Where a follower is in the feed (None: from the first read on)."""

    position: str | None


@dataclass
class Position:
    """A cursor of its own, for a follower of a second feed."""

    position: str | None = None


async def follow(registry: ChangeFeed, cursor: Cursor,
                 apply: Callable[[Change], Awaitable[None]],
                 reload: Callable[[], Awaitable[None]], what: str,
                 block_s: float | None = None, feed: Feed = ROUTES) -> None:
    """Apply every change of `feed` after `cursor.position`, forever (until cancelled);
    `block_s` as `Registry.changes` takes it."""
    while True:
        try:
            async for change in registry.changes(after=cursor.position, block_s=block_s,
                                                 feed=feed):
                cursor.position = change.seq
                await apply(change)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s: change feed failed, keeping what it has: %s", what, exc)
        await asyncio.sleep(FEED_RETRY_S)
        with contextlib.suppress(Exception):
            await reload()
