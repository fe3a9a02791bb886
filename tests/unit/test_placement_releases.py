"""A release's status moves along one table (placement/core/releases.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from placement.core.releases import (
    ENDED,
    MOVES,
    ROLLING_OUT,
    ReleaseStatus,
    going_back_to,
    may_become,
)


@dataclass(frozen=True)
class R:
    version: int
    status: ReleaseStatus
    replaces: int = 0


def test_every_status_has_its_moves_and_the_ended_ones_none() -> None:
    assert set(MOVES) == set(get_args(ReleaseStatus))
    assert {status for status, moves in MOVES.items() if not moves} == ENDED


def test_a_failed_rollback_goes_back_to_what_ran_not_to_an_older_release() -> None:
    """Release 3 ran (its env changed since 2); a rollback to release 2's broken image
    made 4, which failed: the app goes back to 3, though 2 and 1 are older complete or
    failed ones (it went back to 1, the last complete one before 4 once 3 was marked
    rolled back at the rollback)."""
    history = [R(1, "complete"), R(2, "failed", 1), R(3, "complete", 1), R(4, "failed", 3)]
    assert going_back_to(history, 4) == R(3, "complete", 1)
    assert going_back_to(history, 2) == R(1, "complete")


def test_what_ran_is_not_gone_back_to_once_it_has_ended_nor_when_unknown() -> None:
    ended = [R(1, "complete"), R(2, "complete", 1), R(3, "failed", 2), R(4, "rolling", 3)]
    assert going_back_to(ended, 4) == R(2, "complete", 1)  # 3 failed: the last complete
    old_records = [R(1, "complete"), R(2, "complete"), R(3, "rolling")]  # no `replaces`
    assert going_back_to(old_records, 3) == R(2, "complete")
    assert going_back_to([R(1, "failed")], 1) is None  # nothing to go back to
    rolling = [R(1, "complete"), R(2, "rolling", 1), R(3, "pending", 2)]
    assert going_back_to(rolling, 3) == R(2, "rolling", 1)  # what ran, still rolling out


def test_a_rollout_goes_forward_and_ends_and_nothing_leaves_an_end() -> None:
    assert may_become("pending", "rolling") and may_become("rolling", "complete")
    assert may_become("complete", "failed") and may_become("complete", "rolled_back")
    assert not may_become("rolled_back", "complete")  # a pass that raced a rollback
    assert not may_become("failed", "rolled_back")  # a rollback keeps why it failed
    assert not may_become("complete", "rolling") and not may_become("rolling", "pending")
    assert all(may_become(status, status) for status in MOVES)  # (a reason again)
    assert {"pending", "rolling"} == ROLLING_OUT
