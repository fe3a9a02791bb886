"""The market's filters, score terms, hot-spot gate and candidate set, on hand-made workers."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ground.registry.types import WorkerStatus
from placement.core.index import RegionIndex, ReservationLedger
from placement.core.market import (
    DEFAULT_UTILITY,
    FILTERS,
    Decision,
    Market,
    MarketParams,
    PlacementRequest,
    Scored,
    decide,
    first_rejection,
    layers_term,
    piecewise_linear,
    resources_term,
    score,
    spread_term,
    starting_term,
)
from placement.core.offers import no_capacity_reason

NOW = 1_000.0
PARAMS = MarketParams(heartbeat_freshness_s=3.0, reference_bandwidth_bytes_per_s=100.0,
                      reference_pull_time_s=1.0)
IMAGE = {"sha256:a": 60, "sha256:b": 40}


def worker(wid: str, **fields: object) -> WorkerStatus:
    values: dict[str, object] = {
        "id": wid, "epoch": 1, "region": "mad", "url": f"http://{wid}", "cpus": 4.0,
        "memory_mb": 4096, "updated_at": NOW,
    }
    values.update(fields)
    return WorkerStatus(**values)  # type: ignore[arg-type]


def request(**fields: object) -> PlacementRequest:
    values: dict[str, object] = {"app": "hello", "region": "mad", "cpus": 1.0,
                                 "memory_mb": 256, "image_layers": IMAGE}
    values.update(fields)
    return PlacementRequest(**values)  # type: ignore[arg-type]


def market(app_machines: dict[str, int] | None = None) -> Market:
    return Market.of(request(), PARAMS, NOW, app_machines or {})


def run(workers: list[WorkerStatus], req: PlacementRequest | None = None,
        app_machines: dict[str, int] | None = None, params: MarketParams = PARAMS,
        sampler: random.Random | None = None,
        ledger: ReservationLedger | None = None) -> Decision:
    return decide(req or request(), RegionIndex.of(workers), now=NOW, params=params,
                  app_machines=app_machines or {}, sampler=sampler or random.Random(0),
                  ledger=ledger)


@pytest.mark.parametrize(
    ("x", "expected"),
    [(0.0, 0.85), (0.35, 0.925), (0.7, 1.0), (0.8, 1.0), (0.9, 0.5), (0.95, 0.3), (1.0, 0.1)],
)
def test_resources_utility_passes_through_the_default_points_and_interpolates(
    x: float, expected: float
) -> None:
    assert piecewise_linear(DEFAULT_UTILITY, x) == pytest.approx(expected)


def test_resources_term_scores_post_placement_utilisation_by_its_larger_fraction() -> None:
    # 1 of 4 cpus used + 1 placed = 0.5; memory 2560+256 of 4096 ~ 0.6875 -> the larger wins
    w = worker("w1", reserved_cpus=1.0, reserved_memory_mb=2560)
    expected = piecewise_linear(DEFAULT_UTILITY, (2560 + 256) / 4096)
    assert resources_term(w, market()) == pytest.approx(expected)


def test_layers_term_is_one_when_all_layers_are_held_and_falls_with_missing_bytes() -> None:
    assert layers_term(worker("w1", layers=dict(IMAGE)), market()) == 1.0
    assert layers_term(worker("w2", layers={"sha256:a": 60}), market()) == pytest.approx(0.6)
    assert layers_term(worker("w3"), market()) == 0.0
    # layers of other images do not count
    assert layers_term(worker("w4", layers={"sha256:zzz": 10**9}), market()) == 0.0


def test_spread_term_is_one_over_one_plus_machines_of_the_app_on_the_worker() -> None:
    m = market({"w1": 3})
    assert spread_term(worker("w1"), m) == pytest.approx(0.25)
    assert spread_term(worker("w2"), m) == 1.0


def test_starting_gate_penalises_starts_in_flight_per_core() -> None:
    assert starting_term(worker("w1"), market()) == 1.0  # 4 cores
    assert starting_term(worker("w1", machines_starting=1), market()) == 0.8
    assert starting_term(worker("w1", machines_starting=4), market()) == 0.5
    assert starting_term(worker("w1", cpus=0.5, machines_starting=1), market()) == 0.5


def test_a_worker_starting_many_loses_to_a_fuller_one_starting_few() -> None:
    """A herd of 150 cold apps on 3 workers went 100 / 28 / 22 while starts were one term
    of the mean: the resources gate's preference for fuller workers outweighed 80 starts
    in flight against 20. As a gate, starts in flight win that."""
    busy = worker("w-busy", cpus=8.0, memory_mb=8192, reserved_memory_mb=1200,
                  machines_starting=80)
    calm = worker("w-calm", cpus=8.0, memory_mb=8192, reserved_memory_mb=400,
                  machines_starting=20)
    assert [s.worker for s in run([busy, calm]).ranked] == ["w-calm", "w-busy"]


def test_a_worker_holding_all_layers_beats_an_otherwise_equal_one_holding_none() -> None:
    decision = run([worker("w-empty"), worker("w-full", layers=dict(IMAGE))])
    assert [s.worker for s in decision.ranked] == ["w-full", "w-empty"]
    assert decision.ranked[0].terms["layers"] == 1.0
    assert decision.ranked[1].terms["layers"] == 0.0
    assert set(decision.ranked[0].terms) == {"resources", "layers", "spread", "starting"}


def test_a_full_worker_is_filtered_with_insufficient_memory_as_its_reason() -> None:
    decision = run([worker("w-full", reserved_memory_mb=4000), worker("w-ok")])
    [filtered] = decision.filtered
    assert filtered.worker == "w-full" and filtered.stage == "fits"
    assert filtered.reason.startswith("insufficient memory")
    assert [s.worker for s in decision.ranked] == ["w-ok"]


def test_a_worker_without_free_cpus_is_filtered_with_insufficient_cpus() -> None:
    decision = run([worker("w1", reserved_cpus=3.5)])
    assert decision.filtered[0].reason.startswith("insufficient cpus")
    assert decision.outcome == "no_capacity"


def test_a_worker_in_another_region_is_never_ranked() -> None:
    decision = run([worker("w-fra", region="fra", layers=dict(IMAGE))])
    assert decision.ranked == ()
    assert decision.filtered[0].stage == "region"
    assert "fra" in decision.filtered[0].reason


def test_a_stale_heartbeat_is_filtered() -> None:
    decision = run([worker("w-old", updated_at=NOW - 3.5), worker("w-new", updated_at=NOW - 2)])
    assert [s.worker for s in decision.ranked] == ["w-new"]
    assert decision.filtered[0].stage == "healthy"
    assert "stale heartbeat" in decision.filtered[0].reason


def test_draining_and_declined_workers_are_filtered_with_their_reasons() -> None:
    decision = run([worker("w-drain", draining=True), worker("w-said-no"), worker("w-ok")],
                   req=request(declined=frozenset({"w-said-no"})))
    reasons = {f.worker: f.stage for f in decision.filtered}
    assert reasons == {"w-drain": "draining", "w-said-no": "declined"}
    assert [s.worker for s in decision.ranked] == ["w-ok"]


def test_a_worker_that_cannot_pull_is_filtered_for_an_image_it_lacks_with_its_reason() -> None:
    blocked = "free disk 40 MiB (0 MiB more evictable) is below the image cache's reserve"
    decision = run([worker("w-low", pull_blocked=blocked), worker("w-ok")])
    assert [s.worker for s in decision.ranked] == ["w-ok"]
    assert [(f.worker, f.stage, f.reason) for f in decision.filtered] == [
        ("w-low", "pull", f"cannot pull: {blocked}")]
    alone = run([worker("w-low", pull_blocked=blocked)])
    assert no_capacity_reason(alone, []) == (
        f"no worker in region 'mad' fits (1 of 1 filtered: w-low: cannot pull: {blocked})")
    unknown = run([worker("w-low", pull_blocked=blocked, layers=dict(IMAGE))],
                  req=request(image_layers={}))
    assert unknown.ranked == ()  # an image whose layers are not known would be pulled


def test_a_worker_that_cannot_pull_still_takes_an_image_whose_layers_it_holds() -> None:
    decision = run([worker("w-low", pull_blocked="disk", layers=dict(IMAGE)),
                    worker("w-part", pull_blocked="disk", layers={"sha256:a": 60})])
    assert [s.worker for s in decision.ranked] == ["w-low"]
    assert [f.worker for f in decision.filtered] == ["w-part"]


def test_a_no_capacity_reason_names_the_first_workers_filtered_and_counts_the_rest() -> None:
    decision = run([worker(f"w{i}", draining=True) for i in range(5)])
    assert no_capacity_reason(decision, []) == (
        "no worker in region 'mad' fits (5 of 5 filtered: w0: draining, w1: draining, "
        "w2: draining, and 2 more)")


def test_every_score_is_within_zero_and_one() -> None:
    workers = [worker(f"w{i}", reserved_cpus=i * 0.4, machines_starting=i) for i in range(8)]
    decision = run(workers, app_machines={"w1": 2})
    for scored in decision.ranked:
        assert 0.0 <= scored.score <= 1.0
        assert all(0.0 <= v <= 1.0 for v in scored.terms.values())


def test_above_128_workers_only_the_candidate_set_is_scored() -> None:
    holders = {f"w{i:04d}" for i in range(5)}  # five workers hold the whole image
    workers = [worker(f"w{i:04d}", layers=dict(IMAGE) if f"w{i:04d}" in holders else {})
               for i in range(1000)]
    decision = run(workers, sampler=random.Random(7))
    # 5 holders + ceil(log2(1000)) = 10 random others
    assert decision.fleet == 1000 and decision.considered == 15
    scored = {s.worker for s in decision.ranked}
    assert holders <= scored and len(scored) == 15
    assert [s.worker for s in decision.ranked[:5]] == sorted(holders)


def test_above_the_threshold_random_candidates_have_room_and_are_not_declined() -> None:
    workers = [worker(f"w{i:04d}", reserved_memory_mb=4000 if i % 2 else 0)
               for i in range(1000)]
    declined = frozenset(f"w{i:04d}" for i in range(0, 1000, 4))
    decision = run(workers, req=request(declined=declined), sampler=random.Random(3))
    assert decision.considered == 10 and len(decision.ranked) == 10
    assert not {s.worker for s in decision.ranked} & declined


def test_at_or_below_the_threshold_every_worker_is_scored() -> None:
    decision = run([worker(f"w{i}") for i in range(128)])
    assert decision.considered == 128 and len(decision.ranked) == 128


# -- the hot-spot gate ------------------------------------------------------------


def test_no_hot_spot_where_a_cooler_worker_fits() -> None:
    # the holder of every layer would go to 3.75 of 4 cpus (94 %); the other pulls it all
    hot = worker("w-holder", reserved_cpus=2.75, layers=dict(IMAGE))
    cool = worker("w-cool", reserved_cpus=1.0)
    decision = run([hot, cool])
    assert [s.worker for s in decision.ranked] == ["w-cool", "w-holder"]
    assert decision.ranked[1].hot and not decision.ranked[0].hot


def test_a_hot_worker_is_still_offered_when_no_cooler_worker_fits() -> None:
    hot = worker("w-holder", reserved_cpus=2.75, layers=dict(IMAGE))
    full = worker("w-full", reserved_cpus=3.5)
    decision = run([hot, full])
    assert [s.worker for s in decision.ranked] == ["w-holder"]
    assert decision.ranked[0].hot


def test_a_warm_holder_beats_a_cool_worker_that_would_pull_the_whole_image() -> None:
    warm = worker("w-warm", reserved_cpus=2.5, layers=dict(IMAGE))  # 3.5 of 4 after: 87.5 %
    cool = worker("w-cool", reserved_cpus=0.25)
    assert [s.worker for s in run([warm, cool]).ranked] == ["w-warm", "w-cool"]


def test_a_cool_worker_holding_the_image_beats_a_warm_one_holding_it_too() -> None:
    warm = worker("w-a", reserved_cpus=2.5, layers=dict(IMAGE))
    cool = worker("w-b", reserved_cpus=1.0, layers=dict(IMAGE))
    assert [s.worker for s in run([warm, cool]).ranked] == ["w-b", "w-a"]


def test_the_score_is_the_gates_times_the_weighted_mean_of_the_others() -> None:
    w = worker("w1", reserved_cpus=1.0, layers={"sha256:a": 60}, machines_starting=1)
    scored = run([w], app_machines={"w1": 1}).ranked[0]
    terms = scored.terms
    mean = (terms["layers"] * 1.0 + terms["spread"] * 0.5) / 1.5
    assert scored.score == pytest.approx(terms["resources"] * terms["starting"] * mean)
    assert terms == pytest.approx({"resources": resources_term(w, market()), "layers": 0.6,
                                   "spread": 0.5, "starting": 0.8})


# -- the reservation ledger ------------------------------------------------------------


def test_a_herd_of_wakes_spreads_over_workers_through_the_ledger() -> None:
    workers = [worker(f"w{i}", layers=dict(IMAGE)) for i in range(4)]
    ledger = ReservationLedger(hold_s=3.0)
    chosen = []
    for _ in range(12):  # before any heartbeat carries them
        best = run(workers, ledger=ledger).ranked[0].worker
        ledger.reserve(best, 1.0, 256, at=NOW + 0.1)
        chosen.append(best)
    assert chosen[:4] == ["w0", "w1", "w2", "w3"]
    assert sorted(chosen) == sorted(["w0", "w1", "w2", "w3"] * 3)


def test_a_cancelled_reservation_holds_nothing() -> None:
    ledger = ReservationLedger(hold_s=3.0)
    kept = ledger.reserve("w1", 1.0, 256, at=NOW + 0.1)
    declined = ledger.reserve("w1", 2.0, 512, at=NOW + 0.2)
    ledger.cancel(declined)
    ledger.cancel(declined)  # twice: nothing more
    view = ledger.view(worker("w1"), NOW + 0.3)
    assert (view.reserved_cpus, view.reserved_memory_mb, view.machines_starting) == (1.0, 256, 1)
    ledger.cancel(kept)
    assert ledger.view(worker("w1"), NOW + 0.3) == worker("w1") and len(ledger) == 0


def test_a_reserved_worker_is_filtered_once_its_ledger_fills_it() -> None:
    ledger = ReservationLedger(hold_s=3.0)
    for _ in range(4):
        ledger.reserve("w1", 1.0, 256, at=NOW + 0.1)
    decision = run([worker("w1")], ledger=ledger)
    assert decision.outcome == "no_capacity"
    assert decision.filtered[0].reason.startswith("insufficient cpus")


# -- the index against a full scan ---------------------------------------------------


def full_scan(workers: list[WorkerStatus], req: PlacementRequest,
              app_machines: dict[str, int]) -> list[Scored]:
    m = Market.of(req, PARAMS, NOW, app_machines)
    ranked = [score(w, m) for w in workers if first_rejection(w, m, FILTERS) is None]
    return sorted(ranked, key=lambda s: (s.hot, -s.score, s.worker))


fleets = st.lists(
    st.tuples(st.floats(0, 4), st.integers(0, 4096), st.integers(0, 3), st.booleans(),
              st.sets(st.sampled_from([*sorted(IMAGE), "sha256:c"])),
              st.floats(NOW - 5, NOW), st.booleans()),
    min_size=1, max_size=128)


@settings(max_examples=150, deadline=None)
@given(fleet=fleets, spread=st.dictionaries(st.integers(0, 127), st.integers(1, 3)))
def test_the_index_ranks_like_a_full_scan_up_to_the_threshold(
    fleet: list[tuple[float, int, int, bool, set[str], float, bool]], spread: dict[int, int]
) -> None:
    workers = [worker(f"w{i:03d}", reserved_cpus=cpus, reserved_memory_mb=memory,
                      machines_starting=starting, draining=draining,
                      layers={d: IMAGE.get(d, 7) for d in layers}, updated_at=at,
                      pull_blocked="disk" if blocked else "")
               for i, (cpus, memory, starting, draining, layers, at, blocked)
               in enumerate(fleet)]
    app_machines = {f"w{i:03d}": n for i, n in spread.items()}
    decision = run(workers, app_machines=app_machines)
    assert list(decision.ranked) == full_scan(workers, request(), app_machines)
    assert decision.considered == len(workers)
