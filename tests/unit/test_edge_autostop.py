"""machines_to_stop: idle long enough, nothing in flight, never below min running."""

from __future__ import annotations

from edge.core.autostop import MachineActivity, machines_to_stop


def idle(machine_id: str, last_start: float, in_flight: int = 0,
         draining: bool = False) -> MachineActivity:
    return MachineActivity(machine_id, in_flight, last_start, draining)


def test_a_machine_idle_for_idle_timeout_is_stopped_when_min_running_is_0() -> None:
    assert machines_to_stop([idle("m1", 0.0)], "stop", 10.0, 0, now=10.0) == ["m1"]


def test_a_machine_idle_for_less_than_idle_timeout_is_kept() -> None:
    assert machines_to_stop([idle("m1", 0.0)], "stop", 10.0, 0, now=9.9) == []


def test_min_machines_running_is_never_crossed_and_the_longest_idle_go_first() -> None:
    machines = [idle("m1", 5.0), idle("m2", 1.0), idle("m3", 3.0)]
    assert machines_to_stop(machines, "suspend", 1.0, 1, now=100.0) == ["m2", "m3"]
    assert machines_to_stop(machines, "stop", 1.0, 3, now=100.0) == []


def test_a_machine_with_requests_in_flight_is_never_stopped() -> None:
    assert machines_to_stop([idle("m1", 0.0, in_flight=1)], "stop", 1.0, 0, now=100.0) == []


def test_a_request_start_resets_the_idle_timer() -> None:
    before = [idle("m1", 0.0)]
    after_request = [idle("m1", 95.0)]  # a request started at t=95 and has finished
    assert machines_to_stop(before, "stop", 10.0, 0, now=100.0) == ["m1"]
    assert machines_to_stop(after_request, "stop", 10.0, 0, now=100.0) == []


def test_auto_stop_off_stops_nothing() -> None:
    assert machines_to_stop([idle("m1", 0.0)], "off", 1.0, 0, now=100.0) == []


def test_draining_machines_do_not_count_as_running() -> None:
    machines = [idle("m1", 0.0, draining=True), idle("m2", 0.0)]
    assert machines_to_stop(machines, "stop", 1.0, 1, now=100.0) == []
