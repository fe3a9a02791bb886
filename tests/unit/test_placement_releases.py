"""A release's status moves along one table (placement/core/releases.py)."""

from __future__ import annotations

from typing import get_args

from placement.core.releases import MOVES, ROLLING_OUT, ReleaseStatus, may_become


def test_every_status_has_its_moves_and_the_ended_ones_none() -> None:
    assert set(MOVES) == set(get_args(ReleaseStatus))
    assert {status for status, moves in MOVES.items() if not moves} == {
        "failed", "rolled_back"}


def test_a_rollout_goes_forward_and_ends_and_nothing_leaves_an_end() -> None:
    assert may_become("pending", "rolling") and may_become("rolling", "complete")
    assert may_become("complete", "failed") and may_become("complete", "rolled_back")
    assert not may_become("rolled_back", "complete")  # a pass that raced a rollback
    assert not may_become("failed", "rolled_back")  # a rollback keeps why it failed
    assert not may_become("complete", "rolling") and not may_become("rolling", "pending")
    assert all(may_become(status, status) for status in MOVES)  # (a reason again)
    assert {"pending", "rolling"} == ROLLING_OUT
