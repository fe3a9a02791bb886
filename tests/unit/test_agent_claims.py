"""Host-wide claims on user-id ranges and addresses: one owner per slot, whatever agent
asks, stale claims taken over and pruned. (Files in a temp dir; no root needed.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent.oci.claims import Claims, NoSlot


def owners(tmp_path: Path, *names: str) -> list[Path]:
    made = [tmp_path / "agents" / name for name in names]
    for directory in made:
        directory.mkdir(parents=True)
    return made


def test_each_owner_gets_its_own_slot_and_asking_again_gives_the_same(tmp_path: Path) -> None:
    claims = Claims(tmp_path / "claims", slots=64)
    a, b = owners(tmp_path, "a", "b")
    first, second = claims.claim(a), claims.claim(b)
    assert first != second and 1 <= first < 64 and 1 <= second < 64
    assert claims.claim(a) == first
    assert claims.claim(a, wanted=first) == first
    assert claims.claim(b, wanted=first) == second  # taken by a live owner: not given


def test_a_recorded_slot_is_claimed_again_when_free(tmp_path: Path) -> None:
    claims = Claims(tmp_path / "claims", slots=64)
    (a,) = owners(tmp_path, "a")
    assert claims.claim(a, wanted=7) == 7


def test_a_stale_claim_is_taken_over_and_pruned(tmp_path: Path) -> None:
    claims = Claims(tmp_path / "claims", slots=3)  # slots 1 and 2
    a, b, c = owners(tmp_path, "a", "b", "c")
    claims.claim(a), claims.claim(b)
    with pytest.raises(NoSlot):
        claims.claim(c)
    shutil.rmtree(a)  # its agent's state is gone
    assert claims.claim(c) in (1, 2)
    shutil.rmtree(b)
    assert claims.prune() == 1 and claims.prune() == 0


def test_release_lets_go_only_of_ones_own_claim(tmp_path: Path) -> None:
    claims = Claims(tmp_path / "claims", slots=64)
    a, b = owners(tmp_path, "a", "b")
    slot = claims.claim(a)
    claims.release(slot, b)
    assert claims.owner(slot) == str(a)
    claims.release(slot, a)
    assert claims.owner(slot) is None
