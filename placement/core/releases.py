"""A release's status and the moves between them: a table, as the agent's machine states
are (agent/core/state.py). The store moves a release only along it
(placement/store/apps.py `set_release_status`), so a pass that raced a rollback cannot
mark the release rolled back "complete", and a rollback does not rewrite why a release
failed. Where a failed rollout goes back to: `going_back_to`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, Protocol, TypeVar

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


ENDED: frozenset[ReleaseStatus] = frozenset({"failed", "rolled_back"})


class Versioned(Protocol):
    """What the rules read of a release (placement.api.Release)."""

    @property
    def version(self) -> int: ...
    @property
    def status(self) -> ReleaseStatus: ...
    @property
    def replaces(self) -> int: ...


R = TypeVar("R", bound=Versioned)


def going_back_to(releases: Iterable[R], failed: int) -> R | None:
    """Where an app goes when release `failed`'s rollout fails: the release that ran when
    it was made (`replaces`), unless that one has ended; else (a record that does not
    say, or an ended one) the last complete release before it. A rollback to a broken
    release goes back to what ran before the rollback, not to an older release."""
    by_version = {r.version: r for r in releases}
    rollout = by_version.get(failed)
    replaced = by_version.get(rollout.replaces) if rollout is not None else None
    if replaced is not None and replaced.status not in ENDED:
        return replaced
    return max((r for r in by_version.values()
                if r.version < failed and r.status == "complete"),
               key=lambda r: r.version, default=None)


def may_become(was: ReleaseStatus, status: ReleaseStatus) -> bool:
    """Whether a release `was` may be marked `status` (the same again: yes, its reason
    may change)."""
    return status == was or status in MOVES[was]
