"""How often the event loop turned while some work ran: work that yields lets it turn."""

from __future__ import annotations

import asyncio
from types import TracebackType


class LoopTurns:
    """`async with LoopTurns() as turns:` … `turns.count` is how many times a task that
    only yields got to run inside the block."""

    def __init__(self) -> None:
        self.count = 0
        self._task: asyncio.Task[None] | None = None

    async def _turn(self) -> None:
        while True:
            await asyncio.sleep(0)
            self.count += 1

    async def __aenter__(self) -> LoopTurns:
        self._task = asyncio.create_task(self._turn())
        await asyncio.sleep(0)  # running before the block starts
        self.count = 0
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        assert self._task is not None
        self._task.cancel()
