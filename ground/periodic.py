"""A round of work run every few seconds on the event loop until closed.

A round that raises is logged (a warning for the first of a streak of failures, as
the thing it talks to being away is one event, not one per round) and the next round
runs as usual; `on_error` lets the owner fall back meanwhile.

A round may instead ask to rest: it returns the seconds until the next round, and
`stir()` (something the rest was decided without changed) ends the rest early. A round
that returns None, or raises, is followed by the usual `interval_s`, which no stir
shortens. A stir that lands while a round runs is not lost: the rest that follows it
ends at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from ground.tasks import cancel_and_wait


class Periodic:
    def __init__(self, what: str, round_: Callable[[], Awaitable[float | None]],
                 interval_s: float, log: logging.Logger,
                 on_error: Callable[[], None] | None = None) -> None:
        """`what` names the work in the log ("loads not shared with other edges")."""
        self.what = what
        self.round = round_
        self.interval_s = interval_s
        self.log = log
        self.on_error = on_error
        self.failed_rounds = 0
        self._task: asyncio.Task[None] | None = None
        self._stirred = asyncio.Event()

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stir(self) -> None:
        """End a rest the last round asked for: the next round comes now."""
        self._stirred.set()

    async def _run(self) -> None:
        failing = False
        while True:
            self._stirred.clear()
            rest_s: float | None = None
            try:
                rest_s = await self.round()
                failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the next round tries again
                if not failing:
                    self.log.warning("%s now: %s", self.what, exc)
                failing = True
                self.failed_rounds += 1
                if self.on_error is not None:
                    self.on_error()
            if rest_s is None:
                await asyncio.sleep(self.interval_s)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(rest_s):
                    await self._stirred.wait()

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
