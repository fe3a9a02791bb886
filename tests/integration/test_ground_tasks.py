"""A closer's cancel reaches its loops even when one consumes it (ground/tasks.py)."""

from __future__ import annotations

import asyncio

import pytest

from ground import tasks as ground_tasks
from ground.tasks import cancel_and_wait

pytestmark = pytest.mark.integration


async def test_a_loop_that_consumes_its_first_cancel_is_cancelled_again_until_it_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ground_tasks, "RECANCEL_S", 0.05)
    consumed = []

    async def stubborn() -> None:  # as a loop under 3.11's wait_for once went on
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if consumed:
                    raise
                consumed.append(1)

    async def failing() -> None:
        raise ValueError("broken")

    loop_task = asyncio.create_task(stubborn())
    broken = asyncio.create_task(failing())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="broken"):  # as awaiting it would
        await asyncio.wait_for(cancel_and_wait(loop_task, None, broken), 5)
    assert loop_task.cancelled() and consumed == [1]
    ended = asyncio.create_task(failing())
    await asyncio.sleep(0)
    assert ended.done()
    await cancel_and_wait(ended, errors=False)  # not raised
