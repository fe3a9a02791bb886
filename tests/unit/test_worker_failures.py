"""When placement counts a worker failed beyond its heartbeat (placement/core/failures)."""

from __future__ import annotations

from placement.core.failures import ADOPT_MIN_S, MAX_TRACKED, WorkerFailures, independent


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_independent_evidence_is_two_reporters_about_two_machines_within_the_window() -> None:
    clock = Clock()
    failures = WorkerFailures(clock, window_s=10)
    assert failures.report("w1", "edge-a", "m1") is False
    assert failures.report("w1", "edge-a", "m2") is False  # one observer, however often
    assert failures.report("w1", "edge-b", "m1") is True  # two observers, two machines
    clock.now += 11
    assert failures.report("w1", "edge-c", "m3") is False  # the earlier ones are out
    clock.now += 1
    failures.reports.clear()
    failures.report("w1", "edge-a", "m1")
    assert failures.report("w1", "edge-b", "m1") is False  # one machine died, not its host


def test_a_mark_holds_for_its_epoch_until_it_lapses_and_a_new_epoch_clears_it() -> None:
    clock = Clock()
    failures = WorkerFailures(clock, failed_for_s=30)
    assert failures.failed("w1", 3) is None
    assert failures.fail("w1", 3, "agent unreachable") is True
    assert failures.fail("w1", 3, "again") is False  # already failed: not news
    mark = failures.failed("w1", 3)
    assert mark is not None and mark.reason == "agent unreachable"
    assert failures.failed("w1", 2) is not None  # an older epoch's heartbeat changes nothing
    assert failures.failed("w1", 4) is None  # its agent restarted: trusted again
    assert failures.fail("w1", 4, "down again") is True
    clock.now += 30
    assert failures.failed("w1", 4) is None  # lapsed: trusted again if it heartbeats


def test_failing_a_worker_forgets_its_reports_and_the_tables_are_bounded() -> None:
    clock = Clock()
    failures = WorkerFailures(clock)
    failures.report("w1", "edge-a", "m1")
    failures.fail("w1", 1, "x")
    assert failures.report("w1", "edge-b", "m2") is False  # the earlier report is forgotten
    for i in range(MAX_TRACKED + 5):
        failures.report(f"w{i}", "edge-a", "m1")
        failures.fail(f"v{i}", 1, "x")
    assert len(failures.reports) <= MAX_TRACKED and len(failures.marks) <= MAX_TRACKED


def test_standing_marks_name_each_failed_worker_with_its_epoch_until_they_lapse() -> None:
    clock = Clock()
    failures = WorkerFailures(clock, failed_for_s=30)
    failures.fail("w1", 3, "agent unreachable")
    clock.now += 10
    failures.fail("w2", 1, "agent unreachable")
    assert failures.standing() == {"w1": 3, "w2": 1}
    clock.now += 25
    assert failures.standing() == {"w2": 1}


def test_reports_other_placements_heard_count_with_this_ones() -> None:
    failures = WorkerFailures(Clock(), window_s=10)
    assert failures.report("w1", "edge-a", "m1") is False
    assert failures.report("w1", "edge-a", "m1", also=[("edge-a", "m1")]) is False
    assert failures.report("w1", "edge-a", "m1", also=[("edge-b", "m2")]) is True
    assert independent([("edge-a", "m1"), ("edge-b", "m1")]) is False  # one machine
    assert independent([("edge-a", "m1"), ("edge-a", "m2")]) is False  # one observer
    assert independent([]) is False


def test_an_adopted_mark_fails_the_worker_for_the_time_it_has_left() -> None:
    clock = Clock()
    failures = WorkerFailures(clock, failed_for_s=30)
    assert failures.adopt("w1", 3, 12.0, "marked elsewhere") is True
    mark = failures.failed("w1", 3)
    assert mark is not None and mark.reason == "marked elsewhere"
    assert failures.adopt("w1", 3, 11.5, "marked elsewhere") is False  # not news
    assert failures.standing() == {"w1": 3}
    clock.now += 12
    assert failures.failed("w1", 3) is None  # its time ran out here as there
    assert failures.adopt("w1", 3, 0.0, "gone") is False  # (a mark with no time left)


def test_a_mark_of_an_epoch_this_placement_saw_superseded_is_not_adopted() -> None:
    failures = WorkerFailures(Clock(), failed_for_s=30)
    failures.fail("w1", 3, "agent unreachable")
    assert failures.failed("w1", 4) is None  # it came back under epoch 4
    assert failures.adopt("w1", 3, 20.0, "still marked elsewhere") is False
    assert failures.failed("w1", 4) is None
    assert failures.adopt("w1", 4, 20.0, "down again") is True  # a new epoch's mark counts


def test_an_adopted_mark_never_replaces_one_of_a_newer_epoch() -> None:
    failures = WorkerFailures(Clock(), failed_for_s=30)
    failures.fail("w1", 5, "agent unreachable")
    assert failures.adopt("w1", 4, 60.0, "older") is False
    mark = failures.failed("w1", 5)
    assert mark is not None and mark.epoch == 5 and mark.reason == "agent unreachable"


def test_a_mark_of_an_epoch_older_than_the_heartbeat_seen_is_not_adopted() -> None:
    failures = WorkerFailures(Clock(), failed_for_s=30)
    assert failures.failed("w1", 5) is None  # it heartbeats under epoch 5; never marked here
    assert failures.adopt("w1", 4, 20.0, "marked before it restarted") is False
    assert failures.adopt("w1", 5, 20.0, "down again") is True


def test_a_shared_mark_about_to_run_out_is_not_adopted() -> None:
    failures = WorkerFailures(Clock(), failed_for_s=30)
    assert failures.adopt("w1", 1, ADOPT_MIN_S / 2, "its own, run out here already") is False
    assert failures.failed("w1", 1) is None
