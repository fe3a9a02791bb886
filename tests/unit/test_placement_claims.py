"""A placement's wake claims, the rules alone (placement/core/claims.py): what a wake's
plan, its placings and its starts make of them, and which app's published claims must
follow each change."""

from __future__ import annotations

from placement.core.claims import Changed, ClaimLedger, Claims


def test_a_wake_plan_claims_what_it_restarts_and_counts_what_it_places() -> None:
    ledger = ClaimLedger()
    assert ledger.planned("web", ["m1", "m2"], 3) == Changed("web")
    assert ledger.of("web") == Claims(3, frozenset({"m1", "m2"}))
    assert ledger.of("api") == Claims()
    assert ledger.apps() == {"web"}


def test_a_placed_machine_moves_from_placing_to_claimed_and_a_failed_one_just_leaves(
) -> None:
    ledger = ClaimLedger()
    ledger.planned("web", [], 2)
    assert ledger.placed("web", "m7") == Changed("web")
    assert ledger.of("web") == Claims(1, frozenset({"m7"}))
    ledger.placed("web", None)
    assert ledger.of("web") == Claims(0, frozenset({"m7"}))
    assert ledger.placing("web") == 0


def test_another_placed_in_a_declined_ones_stead_counts_until_placed() -> None:
    ledger = ClaimLedger()
    ledger.planned("web", [], 1)
    assert ledger.place_another("web") == Changed("web")
    assert ledger.placing("web") == 2


def test_a_started_machine_is_unclaimed_and_an_app_with_nothing_left_has_no_entry(
) -> None:
    ledger = ClaimLedger()
    ledger.planned("web", ["m1"], 1)
    ledger.placed("web", "m2")
    assert ledger.started("web", "m1") == Changed("web")
    assert ledger.started("web", "m2") == Changed("web")
    assert ledger.started("web", "gone") == Changed("web")  # (twice, or never claimed)
    assert ledger.apps() == set()
    assert ledger.of("web") == Claims()


def test_withdrawing_drops_every_claim_and_names_the_apps_that_had_some() -> None:
    ledger = ClaimLedger()
    ledger.planned("web", ["m1"], 0)
    ledger.planned("api", [], 2)
    ledger.planned("idle", [], 0)
    assert ledger.withdraw() == ["api", "web"]
    assert ledger.apps() == set()
