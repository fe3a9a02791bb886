"""The rule that holds the reconciler after a registry loss (placement/core/refill.py)."""

from __future__ import annotations

from placement.core.refill import begin, over, still_awaited


def test_a_refill_waits_for_every_worker_live_before_the_loss_to_publish_under_the_new_generation(
) -> None:
    refill = begin("g2", 100.0, ["w1", "w2"])
    assert not over(refill, {}, 101.0, bound_s=30)
    # w1's heartbeat under the old generation (sent before it noticed) does not count
    assert not over(refill, {"w1": "g1", "w2": "g2"}, 101.0, bound_s=30)
    assert still_awaited(refill, {"w1": "g1", "w2": "g2"}) == {"w1"}
    assert over(refill, {"w1": "g2", "w2": "g2"}, 101.0, bound_s=30)


def test_a_worker_not_awaited_changes_nothing_and_a_new_one_is_not_waited_for() -> None:
    refill = begin("g2", 100.0, ["w1"])
    assert not over(refill, {"w9": "g2"}, 101.0, bound_s=30)
    assert over(refill, {"w1": "g2"}, 101.0, bound_s=30)


def test_a_worker_that_never_comes_back_holds_the_refill_only_until_the_bound() -> None:
    refill = begin("g2", 100.0, ["w1", "dead"])
    assert not over(refill, {"w1": "g2"}, 129.9, bound_s=30)
    assert over(refill, {"w1": "g2"}, 130.0, bound_s=30)


def test_with_no_worker_live_before_the_loss_nothing_is_awaited() -> None:
    assert over(begin("g2", 100.0, []), {}, 100.0, bound_s=30)
