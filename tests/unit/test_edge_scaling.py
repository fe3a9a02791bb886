"""machines_to_start and the single-flight wake gate."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edge.core.scaling import AppLoad, machines_to_start, next_wake


def load(**counts: int | bool) -> AppLoad:
    base: dict[str, int | bool] = dict(in_flight=0, held=0, started=0, starting=0, soft_limit=20,
                                       max_machines=100)
    base.update(counts)
    return AppLoad(**base)  # type: ignore[arg-type]


def test_burst_of_1000_at_soft_limit_20_starts_exactly_50_machines() -> None:
    assert machines_to_start(load(held=1000)) == 50


def test_burst_of_1000_is_capped_by_max_machines() -> None:
    assert machines_to_start(load(held=1000, max_machines=3)) == 3


def test_started_and_starting_machines_count_against_the_need_and_the_cap() -> None:
    assert machines_to_start(load(in_flight=300, held=700, started=10, starting=5)) == 35
    assert machines_to_start(load(held=1000, started=2, max_machines=3)) == 1
    assert machines_to_start(load(held=10, started=1)) == 0


def test_a_single_held_request_starts_one_machine() -> None:
    assert next_wake(load(held=1)) == 1


def test_no_wake_starts_while_one_is_in_flight_or_nothing_is_held() -> None:
    assert next_wake(load(held=500, wake_in_flight=True)) == 0
    assert next_wake(load(in_flight=500)) == 0


def test_after_a_wake_returns_the_next_asks_only_for_the_remainder() -> None:
    first = next_wake(load(held=1))
    second = next_wake(load(held=199, in_flight=1, started=first, max_machines=3))
    assert first + second == 3


@given(st.integers(0, 5000), st.integers(0, 5000), st.integers(1, 100), st.integers(0, 50),
       st.integers(0, 50), st.integers(1, 200))
def test_the_count_is_never_negative_and_never_exceeds_max_machines(
    in_flight: int, held: int, soft: int, started: int, starting: int, max_machines: int
) -> None:
    count = machines_to_start(load(in_flight=in_flight, held=held, soft_limit=soft,
                                   started=started, starting=starting, max_machines=max_machines))
    assert count >= 0
    assert count == 0 or started + starting + count <= max_machines
    assert (started + starting + count) * soft >= min(in_flight + held,
                                                      max_machines * soft) or count == 0
