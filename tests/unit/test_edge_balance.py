"""balance.pick: least loaded under soft, then under hard, never above hard."""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from edge.core.balance import free_slots, pick, pick_avoiding


@dataclass
class Machine:
    name: str
    in_flight: int


def test_the_least_loaded_machine_under_soft_limit_is_chosen() -> None:
    machines = [Machine("a", 5), Machine("b", 2), Machine("c", 9)]
    assert pick(machines, 10, 20, random.Random(1)).name == "b"  # type: ignore[union-attr]


def test_when_all_are_at_soft_limit_the_least_loaded_under_hard_is_chosen() -> None:
    machines = [Machine("a", 12), Machine("b", 11), Machine("c", 20)]
    assert pick(machines, 10, 20, random.Random(1)).name == "b"  # type: ignore[union-attr]


def test_no_machine_is_chosen_when_all_are_at_hard_limit_so_the_request_is_held() -> None:
    machines = [Machine("a", 20), Machine("b", 25)]
    assert pick(machines, 10, 20, random.Random(1)) is None
    assert pick([], 10, 20, random.Random(1)) is None


def test_with_many_machines_two_random_choices_pick_the_less_loaded_of_the_two() -> None:
    machines = [Machine(str(i), i) for i in range(10)]

    class Fixed:
        values = iter([0.35, 0.75])

        def random(self) -> float:
            return next(self.values)

    assert pick(machines, 100, 200, Fixed()).name == "3"  # type: ignore[union-attr]


def test_free_slots_counts_room_below_hard_limit() -> None:
    assert free_slots([Machine("a", 3), Machine("b", 30)], 25) == 22


@given(st.lists(st.integers(0, 40), max_size=12), st.integers(1, 20), st.integers(0, 20),
       st.integers(0, 1000))
def test_a_pick_never_takes_a_machine_to_or_past_hard_limit_and_prefers_under_soft(
    loads: list[int], soft: int, extra: int, seed: int
) -> None:
    hard = soft + extra
    machines = [Machine(str(i), n) for i, n in enumerate(loads)]
    chosen = pick(machines, soft, hard, random.Random(seed))
    if chosen is None:
        assert all(m.in_flight >= hard for m in machines)
        return
    assert chosen.in_flight < hard
    if any(m.in_flight < soft for m in machines):
        assert chosen.in_flight < soft
    if len(machines) <= 4:
        assert chosen.in_flight == min(m.in_flight for m in machines if m.in_flight < hard)


def _two_tier_model(machines: list[Machine], soft: int, hard: int) -> Machine | None:
    """The rule as stated: least loaded under soft, else least loaded under hard."""
    for limit in (soft, hard):
        under = [m for m in machines if m.in_flight < limit]
        if under:
            return min(under, key=lambda m: m.in_flight)
    return None


@given(st.lists(st.integers(0, 40), max_size=4), st.integers(1, 20), st.integers(0, 20))
def test_with_few_machines_the_one_scan_picks_exactly_what_the_two_tier_rule_picks(
    loads: list[int], soft: int, extra: int
) -> None:
    machines = [Machine(str(i), n) for i, n in enumerate(loads)]
    expected = _two_tier_model(machines, soft, soft + extra)
    assert pick(machines, soft, soft + extra, random.Random(0)) is expected


class Tunnels:
    def __init__(self, in_flight: int, tunnels: int) -> None:
        self.in_flight = in_flight
        self.tunnels = tunnels


def test_a_tunnel_goes_to_the_fewest_tunnels_under_the_limit_with_room() -> None:
    from edge.core.balance import pick_tunnel, tunnel_limit

    assert tunnel_limit(5, 0.8) == 4 and tunnel_limit(1, 0.8) == 1 and tunnel_limit(100, 1.0) == 100
    a, b, c = Tunnels(4, 4), Tunnels(3, 2), Tunnels(5, 1)  # c has no room at all
    assert pick_tunnel([a, b, c], limit=4, hard_limit=5) is b
    assert pick_tunnel([a, Tunnels(4, 4)], limit=4, hard_limit=5) is None


def test_a_request_sent_again_avoids_the_machines_that_lost_it_while_others_have_room() -> None:
    a, b, c = Machine("a", 0), Machine("b", 3), Machine("c", 9)
    rand = random.Random(1)
    assert pick_avoiding([a, b, c], 10, 20, rand, [a]) is b
    assert pick_avoiding([a, b, c], 10, 20, rand, [a, b]) is c
    # every machine lost it: chosen among all, as a first send would be
    assert pick_avoiding([a, b, c], 10, 20, rand, [a, b, c]) is a
    # the others are full: held (None), not sent back to the one that lost it
    assert pick_avoiding([a, Machine("d", 20)], 10, 20, rand, [a]) is None


@given(st.lists(st.integers(0, 30), min_size=1, max_size=12), st.data())
def test_pick_avoiding_never_returns_an_avoided_machine_while_another_is_routable(
    loads: list[int], data: st.DataObject,
) -> None:
    machines = [Machine(str(i), load) for i, load in enumerate(loads)]
    avoid = data.draw(st.lists(st.sampled_from(machines), unique_by=lambda m: m.name))
    chosen = pick_avoiding(machines, 10, 20, random.Random(0), avoid)
    others = [m for m in machines if m not in avoid]
    if others:
        assert chosen is None or chosen not in avoid
        assert (chosen is None) == (pick(others, 10, 20, random.Random(0)) is None)
    else:
        assert (chosen is None) == (pick(machines, 10, 20, random.Random(0)) is None)
