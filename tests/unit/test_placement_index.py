"""The region index (draws by free memory, image tops kept as holders change) and the
reservation ledger, on hand-made workers; the tops checked against a full scan."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from ground.registry.types import WorkerStatus
from placement.core.index import RegionIndex, ReservationLedger, held_bytes

NOW = 1_000.0
LAYERS = {"base": 500, "lib": 200, "app": 50, "other": 300}
IMAGE = {"base": 500, "lib": 200, "app": 50}


def worker(wid: str, **fields: object) -> WorkerStatus:
    values: dict[str, object] = {
        "id": wid, "epoch": 1, "region": "mad", "url": f"http://{wid}", "cpus": 4.0,
        "memory_mb": 4096, "updated_at": NOW,
    }
    values.update(fields)
    return WorkerStatus(**values)  # type: ignore[arg-type]


def holding(wid: str, *digests: str, **fields: object) -> WorkerStatus:
    return worker(wid, layers={d: LAYERS[d] for d in digests}, **fields)


def brute_top(index: RegionIndex, image: dict[str, int], k: int) -> list[int]:
    held = sorted((held_bytes(w, image.items()) for w in index.workers.values()), reverse=True)
    return [h for h in held if h > 0][:k]


def test_top_holders_are_the_workers_holding_most_of_the_image_ties_by_id() -> None:
    index = RegionIndex.of([holding("w3", "base"), holding("w1", "base", "lib", "app"),
                            holding("w2", "app"), holding("w0", "base", "lib", "app"),
                            holding("w4", "other"), worker("w5")])
    assert [w.id for w in index.top_holders(IMAGE, 3)] == ["w0", "w1", "w3"]
    assert [w.id for w in index.top_holders(IMAGE, 10)] == ["w0", "w1", "w3", "w2"]


def test_a_cached_top_follows_a_holder_that_drops_a_layer_and_one_that_pulls_it() -> None:
    index = RegionIndex.of([holding(f"w{i}", "base", "lib", "app") for i in range(4)]
                           + [holding("w9", "base")])
    assert [w.id for w in index.top_holders(IMAGE, 2)] == ["w0", "w1"]
    index.upsert(holding("w0", "base"))  # evicted lib and app
    index.upsert(holding("w9", "base", "lib", "app"))
    index.remove("w1")
    assert [w.id for w in index.top_holders(IMAGE, 3)] == ["w2", "w3", "w9"]


def test_draws_have_room_are_distinct_and_skip_excluded_draining_and_stale_workers() -> None:
    workers = [worker(f"w{i:03d}", reserved_memory_mb=(i % 8) * 512,
                      draining=i % 10 == 0, updated_at=NOW - (5 if i % 7 == 0 else 0))
               for i in range(300)]
    index = RegionIndex.of(workers)
    exclude = {f"w{i:03d}" for i in range(0, 300, 3)}
    rng = random.Random(1)
    for _ in range(50):
        drawn = index.draw(2048, 9, rng, exclude, fresh_since=NOW - 3)
        assert len(drawn) == len({w.id for w in drawn}) == 9
        for w in drawn:
            assert w.memory_mb - w.reserved_memory_mb >= 2048
            assert w.id not in exclude and not w.draining and w.updated_at >= NOW - 3


def test_a_worker_removed_or_moved_between_buckets_is_drawn_only_from_where_it_is() -> None:
    index = RegionIndex.of([worker("w0"), worker("w1")])
    index.upsert(worker("w0", reserved_memory_mb=4000))  # 96 MB free now
    index.remove("w1")
    assert index.draw(1024, 2, random.Random(0), set()) == []
    assert [w.id for w in index.draw(64, 2, random.Random(0), set())] == ["w0"]
    assert len(index) == 1


def test_the_ledger_counts_an_offer_until_a_heartbeat_after_it_and_expires() -> None:
    ledger = ReservationLedger(hold_s=3.0)
    ledger.reserve("w1", 1.0, 512, at=NOW + 0.5)
    seen = ledger.view(worker("w1", updated_at=NOW), NOW + 0.6)
    assert (seen.reserved_cpus, seen.reserved_memory_mb, seen.machines_starting) == (1.0, 512, 1)
    # a heartbeat produced after the offer carries the reservation itself
    later = worker("w1", updated_at=NOW + 1, reserved_cpus=1.0)
    assert ledger.view(later, NOW + 1.1) == later
    assert len(ledger._by_worker) == 0
    ledger.reserve("w2", 1.0, 512, at=NOW + 2)
    ledger.expire(NOW + 5.5)
    assert len(ledger) == 0
    assert ledger.view(worker("w2"), NOW + 5.5) == worker("w2")


def test_the_ledger_ignores_an_offer_past_its_hold_even_without_a_heartbeat() -> None:
    ledger = ReservationLedger(hold_s=3.0)
    ledger.reserve("w1", 1.0, 512, at=NOW + 0.5)
    assert ledger.view(worker("w1"), NOW + 3.6) == worker("w1")


changes = st.lists(
    st.tuples(st.integers(0, 59), st.sets(st.sampled_from(sorted(LAYERS))), st.booleans()),
    max_size=200)


@settings(max_examples=200, deadline=None)
@given(initial=changes, later=changes, k=st.integers(1, 8))
def test_image_tops_kept_as_holders_change_match_a_full_scan(
    initial: list[tuple[int, set[str], bool]], later: list[tuple[int, set[str], bool]], k: int
) -> None:
    index = RegionIndex()
    images = [IMAGE, {"base": 500, "other": 300}, {"app": 50}]

    def apply(ops: list[tuple[int, set[str], bool]]) -> None:
        for n, digests, gone in ops:
            if gone:
                index.remove(f"w{n:02d}")
            else:
                index.upsert(holding(f"w{n:02d}", *digests))

    apply(initial)
    for image in images:
        index.top_holders(image, k)  # cached from here on
    apply(later)
    for image in images:
        top = [held_bytes(w, image.items()) for w in index.top_holders(image, k)]
        assert top == brute_top(index, image, k)


def test_a_top_computed_in_steps_is_the_one_computed_whole() -> None:
    rng = random.Random(3)
    fleet = [holding(f"w{i:03d}", *rng.sample(sorted(LAYERS), rng.randint(0, 4)))
             for i in range(300)]
    stepped, whole = RegionIndex.of(fleet), RegionIndex.of(fleet)
    steps = sum(1 for _ in stepped.compute_top_steps(IMAGE, 8, step=50))
    assert steps >= 3 and stepped.knows_top(IMAGE, 8)
    assert ([w.id for w in stepped.top_holders(IMAGE, 8)]
            == [w.id for w in whole.top_holders(IMAGE, 8)])
    assert list(stepped.compute_top_steps(IMAGE, 8)) == []  # cached: nothing to do


def test_a_top_whose_layers_changed_holders_between_steps_is_not_kept() -> None:
    index = RegionIndex.of([holding(f"w{i}", "base", "lib") for i in range(10)])
    steps = index.compute_top_steps(IMAGE, 2, step=4)
    next(steps)
    index.upsert(holding("w99", "base", "lib", "app"))  # meanwhile: a better holder
    for _ in steps:
        pass
    assert not index.knows_top(IMAGE, 2)  # the next decision computes it whole
    assert [w.id for w in index.top_holders(IMAGE, 2)] == ["w99", "w0"]
