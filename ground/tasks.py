"""Ending a service's long-lived tasks when it stops.

A closer cancels its loops and waits for them. One cancel is not always enough: a
cancel can be consumed below the loop and the loop goes on, `cancelling` but
running, and a closer that waits for it waits forever. On Python 3.11 any library
call under `asyncio.wait_for` can consume it (wait_for returns an inner result that
came in the same turn as the cancel): redis-py's sends did, about one run in 40 of
tests/integration/test_registry_loss.py hung in an agent's, a placement's or a
periodic loop's stop (`ground/registry/redis.py`, `CancelSafeRedis`, mends the Redis
client). So that no other library's can hang a stop, a task still running
`RECANCEL_S` after its cancel is cancelled again, until it ends (and said).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

A = TypeVar("A")
B = TypeVar("B")

log = logging.getLogger("thaw")

RECANCEL_S = 5.0  # longer than any loop's own clean-up after a cancel


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None, errors: bool = True) -> None:
    """Cancel `tasks` (None: none) and return once every one has ended, cancelling again
    any still running after `RECANCEL_S`. With `errors`, the first task that ended in an
    exception other than a cancel has it raised here (as awaiting it would)."""
    given = [task for task in tasks if task is not None]
    pending = {task for task in given if not task.done()}
    rounds = 0
    while pending:
        for task in pending:
            task.cancel()
        if rounds:
            log.warning("%d task(s) went on %.0f s after a cancel: cancelling again (%s)",
                        len(pending), RECANCEL_S,
                        ", ".join(sorted(repr(t.get_coro()) for t in pending)))
        rounds += 1
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
    failed = [task.exception() for task in given if not task.cancelled()]
    first = next((exc for exc in failed if exc is not None), None)
    if errors and first is not None:
        raise first


async def both(first: Awaitable[A], second: Awaitable[B]) -> tuple[A, B]:
    """`first` and `second` at once (two independent round trips in the time of one); the
    first to fail has the other cancelled and waited for, and its exception raised as
    awaiting it alone would (not grouped)."""
    tasks = (asyncio.ensure_future(first), asyncio.ensure_future(second))
    try:
        a, b = await asyncio.gather(*tasks)
    except BaseException:
        await cancel_and_wait(*tasks, errors=False)
        raise
    return a, b
