"""What the reconciler looks at when nothing asked (placement/core/sweep.py)."""

from __future__ import annotations

from placement.core.sweep import SWEEP_PER_S, SWEEP_S, on_gone_workers, sweep_gap_s


def test_a_sweep_of_few_apps_spreads_them_over_the_whole_period() -> None:
    assert sweep_gap_s(10) == SWEEP_S / 10
    assert sweep_gap_s(0) == SWEEP_S  # no app: the loop still waits, never spins


def test_a_sweep_of_10000_apps_never_passes_faster_than_its_rate() -> None:
    assert sweep_gap_s(10_000) == 1 / SWEEP_PER_S
    assert sweep_gap_s(10_000_000) == 1 / SWEEP_PER_S
    assert sweep_gap_s(10_000, sweep_s=60, per_s=1000) == 60 / 10_000


def test_a_worker_gone_silent_asks_only_for_the_apps_that_had_machines_on_it() -> None:
    observed = {"a": {("w1", "started"): 1}, "b": {("w2", "started"): 2},
                "c": {("w1", "lost"): 1, ("w3", "created"): 1}, "d": {}}
    gone, apps = on_gone_workers(observed, {"w1", "w2", "w3"}, {"w2", "w3"})
    assert gone == {"w1"} and apps == ["a", "c"]


def test_no_worker_gone_asks_for_nothing_and_a_new_one_is_not_gone() -> None:
    observed = {"a": {("w1", "started"): 1}}
    assert on_gone_workers(observed, {"w1"}, {"w1", "w2"}) == (set(), [])
    assert on_gone_workers(observed, set(), {"w1"}) == (set(), [])
