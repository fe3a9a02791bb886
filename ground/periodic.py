"""A round of work run every few seconds on the event loop until closed.

A round that raises is logged (a warning for the first of a streak of failures, as
the thing it talks to being away is one event, not one per round) and the next round
runs as usual; `on_error` lets the owner fall back meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ground.tasks import cancel_and_wait


class Periodic:
    def __init__(self, what: str, round_: Callable[[], Awaitable[None]], interval_s: float,
                 log: logging.Logger, on_error: Callable[[], None] | None = None) -> None:
        """`what` names the work in the log ("loads not shared with other edges")."""
        self.what = what
        self.round = round_
        self.interval_s = interval_s
        self.log = log
        self.on_error = on_error
        self.failed_rounds = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        failing = False
        while True:
            try:
                await self.round()
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
            await asyncio.sleep(self.interval_s)

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
