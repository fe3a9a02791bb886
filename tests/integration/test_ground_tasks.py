"""A closer's cancel reaches its loops even when one consumes it (ground/tasks.py)."""

from __future__ import annotations

import asyncio

import pytest

from ground import tasks as ground_tasks
from ground.tasks import both, cancel_and_wait

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


async def test_a_periodic_round_rests_as_long_as_it_asks_unless_stirred_and_no_stir_is_lost(
) -> None:
    import logging

    from ground.periodic import Periodic

    rounds: list[float] = []
    stir_in_round = [False]
    rounds_ran = asyncio.Event()

    async def round_() -> float | None:
        rounds.append(asyncio.get_running_loop().time())
        rounds_ran.set()
        if stir_in_round[0]:  # something changed while the round ran
            stir_in_round[0] = False
            periodic.stir()
        return 60.0  # rest a minute

    periodic = Periodic("test rounds", round_, 0.01, logging.getLogger("test"))
    periodic.start()
    try:
        await asyncio.wait_for(rounds_ran.wait(), 5)
        await asyncio.sleep(0.2)  # twenty intervals: still one round, resting
        assert len(rounds) == 1
        rounds_ran.clear()
        stir_in_round[0] = True
        periodic.stir()  # ends the rest: round 2, which is stirred as it runs...
        await asyncio.wait_for(rounds_ran.wait(), 5)
        await asyncio.sleep(0.2)
        assert len(rounds) == 3  # ...so round 3 follows at once, then it rests again
    finally:
        await periodic.close()


async def test_both_runs_two_awaitables_at_once_and_answers_in_order() -> None:
    """Each waits for the other to have started: one after the other, they never end."""
    started = {"a": asyncio.Event(), "b": asyncio.Event()}

    async def one(name: str, other: str) -> str:
        started[name].set()
        await started[other].wait()
        return name

    async with asyncio.timeout(10):
        assert await both(one("a", "b"), one("b", "a")) == ("a", "b")


async def test_both_raises_the_first_failure_as_is_and_cancels_the_other() -> None:
    ended: list[str] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            ended.append("slow")

    async def fails() -> None:
        await asyncio.sleep(0)
        raise KeyError("no such thing")

    with pytest.raises(KeyError, match="no such thing"):
        await both(slow(), fails())
    assert ended == ["slow"]  # cancelled and waited for before the error is raised
