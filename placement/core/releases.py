"""A release's status and the moves between them: a table, as the agent's machine states
are (agent/core/state.py). The store moves a release only along it
(placement/store/apps.py `set_release_status`), so a pass that raced a rollback cannot
mark the release rolled back "complete", and a rollback does not rewrite why a release
failed."""

from __future__ import annotations

from typing import Literal

ReleaseStatus = Literal["pending", "rolling", "complete", "failed", "rolled_back"]

ROLLING_OUT: frozenset[ReleaseStatus] = frozenset({"pending", "rolling"})

MOVES: dict[ReleaseStatus, frozenset[ReleaseStatus]] = {
    # made by a deploy or a rollback; rolling once a pass replaces its first machine
    "pending": frozenset({"rolling", "complete", "failed", "rolled_back"}),
    "rolling": frozenset({"complete", "failed", "rolled_back"}),
    # what runs: it may still fail (its machines crash-looping) or be left by a rollback
    "complete": frozenset({"failed", "rolled_back"}),
    "failed": frozenset(),  # ended, with its reason
    "rolled_back": frozenset(),  # ended
}


def may_become(was: ReleaseStatus, status: ReleaseStatus) -> bool:
    """Whether a release `was` may be marked `status` (the same again: yes, its reason
    may change)."""
    return status == was or status in MOVES[was]
