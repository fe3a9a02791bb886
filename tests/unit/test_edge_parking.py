"""Parked idle connections (edge/core/parking.py): closed once idle long enough, in
any order their watchdogs parked them, with a sweep that stops at the first young one."""

from __future__ import annotations

import random

from edge.core.parking import Parking


def test_a_connection_expires_once_idle_for_the_timeout() -> None:
    parking: Parking[str] = Parking(60.0, 2.5)
    parking.park("a", 10.0)
    assert parking.expired(69.9) == []
    assert parking.expired(70.0) == ["a"]
    assert len(parking) == 0


def test_reading_again_takes_a_connection_out_and_parking_again_moves_it_last() -> None:
    parking: Parking[str] = Parking(60.0, 2.5)
    parking.park("a", 0.0)
    parking.park("b", 1.0)
    parking.unpark("a")
    assert parking.expired(100.0) == ["b"]
    parking.park("a", 5.0)
    parking.park("b", 6.0)
    parking.park("a", 50.0)  # (it read, was answered, and went idle again)
    assert parking.expired(66.0) == ["b"]
    assert parking.expired(110.0) == ["a"]


def test_any_parking_order_within_the_slack_expires_exactly_the_old_enough() -> None:
    rng = random.Random(7)
    for _ in range(200):
        slack = rng.choice([0.5, 2.5, 10.0])
        parking: Parking[int] = Parking(60.0, slack)
        idle: dict[int, float] = {}
        now = 0.0
        for key in range(rng.randint(1, 60)):
            now += rng.random() * 3
            since = now - rng.random() * slack  # parked within its watchdog's period
            parking.park(key, since)
            idle[key] = since
        sweep = now + rng.random() * 90
        expected = sorted(k for k, since in idle.items() if since <= sweep - 60.0)
        assert sorted(parking.expired(sweep)) == expected
        assert len(parking) == len(idle) - len(expected)


def test_a_sweep_stops_at_the_first_young_connection() -> None:
    parking: Parking[int] = Parking(60.0, 1.0)
    parking.park(1, 100.0)  # young beyond the slack: the sweep looks no further...
    parking.park(2, 0.0)  # ...so one parked out of its order (never done) is not seen
    assert parking.expired(70.0) == []
    parking.unpark(1)
    assert parking.expired(70.0) == [2]
