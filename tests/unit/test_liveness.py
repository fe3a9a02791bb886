"""placement/core/liveness.py: workers are failed on evidence the registry was answering."""

from __future__ import annotations

from placement.core.liveness import Beat, Liveness

ALLOWED_S = 3.0


def liveness() -> Liveness:
    return Liveness(ALLOWED_S, max_gap_s=1.5)


def beats(stamp: float, *workers: str, epoch: int = 1) -> list[Beat]:
    return [Beat(w, epoch, stamp) for w in workers]


def read_every_second(lv: Liveness, start: float, end: float, stamps: dict[str, float],
                      epoch: int = 1) -> None:
    """Reads answered once a second from `start` to `end` (included), the workers of
    `stamps` heartbeating with those unchanged stamps."""
    t = start
    while t <= end:
        lv.answered([Beat(w, epoch, s) for w, s in stamps.items()], t - 0.01, t)
        t += 1.0


def test_a_worker_heartbeating_while_the_registry_answers_is_live() -> None:
    lv = liveness()
    for t in range(10):
        lv.answered(beats(1000.0 + t, "w1", "w2"), t - 0.01, float(t))
    judged = lv.judge(9.5)
    assert judged.live == {"w1", "w2"} and not judged.doubt and not judged.failed


def test_a_worker_silent_while_the_registry_answers_is_failed_after_the_allowed_time() -> None:
    lv = liveness()
    for t in range(10):
        lv.answered([Beat("w1", 1, 1000.0 + t), Beat("w2", 1, 1000.0), Beat("w3", 1, 1000.0 + t)],
                    t - 0.01, float(t))
    judged = lv.judge(9.0)
    assert judged.failed == {"w2"} and judged.live == {"w1", "w3"}
    assert lv.judge(2.5).failed == frozenset()  # not yet lapsed


def test_heartbeats_count_from_when_placement_saw_them_not_from_the_agents_clock() -> None:
    lv = liveness()  # the agent's clock is an hour behind: its stamps are still news
    for t in range(5):
        lv.answered(beats(-3600.0 + t, "w1"), t - 0.01, float(t))
    assert lv.judge(4.5).live == {"w1"}


def test_a_registry_stall_fails_nobody_when_it_answers_again() -> None:
    lv = liveness()
    read_every_second(lv, 0.0, 5.0, {"w1": 5.0})
    # a 10 s stall: the read sent at 5.5 answers at 15.5 with the heartbeat from before
    lv.answered(beats(5.0, "w1"), 5.5, 15.5)
    judged = lv.judge(15.6)
    assert judged.doubt == {"w1"} and not judged.failed and judged.healthy_since == 15.5
    # the worker heartbeats again within the allowed time: live
    lv.answered(beats(16.0, "w1"), 16.4, 16.5)
    assert lv.judge(16.6).live == {"w1"}


def test_a_failed_read_restarts_the_run_of_answers() -> None:
    lv = liveness()
    read_every_second(lv, 0.0, 5.0, {"w1": 1.0})  # w1 stopped heartbeating at 0
    lv.unanswered()
    assert lv.judge(5.5).failed == frozenset() and lv.judge(5.5).doubt == {"w1"}
    lv.answered(beats(1.0, "w1"), 5.9, 6.0)
    assert lv.judge(8.9).failed == frozenset()  # 2.9 s of answers: not enough yet
    read_every_second(lv, 7.0, 10.0, {"w1": 1.0})
    assert lv.judge(9.1).failed == {"w1"}


def test_a_gap_between_answers_restarts_the_run_of_answers() -> None:
    lv2 = liveness()
    read_every_second(lv2, 0.0, 2.0, {"w1": 1.0})
    lv2.answered(beats(1.0, "w1"), 9.9, 10.0)  # no answer for 8 s (no reads, or lost)
    assert lv2.judge(10.5).failed == frozenset()
    read_every_second(lv2, 11.0, 14.0, {"w1": 1.0})
    assert lv2.judge(13.1).failed == {"w1"}


def test_a_slow_read_is_no_evidence_either() -> None:
    lv = liveness()
    read_every_second(lv, 0.0, 2.0, {"w1": 1.0})
    lv.answered(beats(1.0, "w1"), 2.9, 3.0)
    lv.answered(beats(1.0, "w1"), 3.1, 5.0)  # one read that took 1.9 s
    assert lv.healthy_since == 5.0


def test_many_workers_lapsing_at_once_fails_nobody() -> None:
    lv = liveness()
    read_every_second(lv, 0.0, 10.0, {"w1": 1.0, "w2": 1.0, "w3": 5.0})
    lv.answered([Beat("w1", 1, 1.0), Beat("w2", 1, 1.0), Beat("w3", 1, 11.0)], 10.9, 11.0)
    judged = lv.judge(11.0)
    assert judged.correlated and not judged.failed
    assert judged.doubt == {"w1", "w2"} and judged.live == {"w3"}


def test_one_of_two_workers_lapsing_is_failed_but_both_at_once_are_not() -> None:
    lv = liveness()
    for t in range(10):
        lv.answered([Beat("w1", 1, 1.0), Beat("w2", 1, float(t))], t - 0.01, float(t))
    assert lv.judge(9.0).failed == {"w1"}
    both = liveness()
    read_every_second(both, 0.0, 10.0, {"w1": 1.0, "w2": 1.0})
    judged = both.judge(10.0)
    assert judged.correlated and judged.doubt == {"w1", "w2"} and not judged.failed


def test_a_single_worker_is_failed_on_its_own_missed_heartbeats() -> None:
    lv = liveness()
    read_every_second(lv, 0.0, 10.0, {"w1": 1.0})
    assert lv.judge(10.0).failed == {"w1"}


def test_a_worker_whose_key_expired_stays_known_as_it_was_last_seen() -> None:
    lv = liveness()
    read_every_second(lv, 0.0, 3.0, {"w1": 1.0, "w2": 1.0, "w3": 1.0})
    lv.answered(beats(9.0, "w3"), 8.5, 9.0)  # after a stall: w1 and w2 expired in Redis
    judged = lv.judge(9.0)
    assert judged.doubt == {"w1", "w2"} and judged.live == {"w3"} and not judged.failed


def test_a_worker_missing_from_the_registry_is_forgotten_after_forget_s() -> None:
    lv = Liveness(ALLOWED_S, max_gap_s=1.5, forget_s=60.0)
    read_every_second(lv, 0.0, 3.0, {"w1": 1.0, "w2": 1.0, "w3": 1.0})
    for t in range(4, 11):
        lv.answered([Beat("w2", 1, float(t)), Beat("w3", 1, float(t))], t - 0.01, float(t))
    assert lv.judge(10.0).failed == {"w1"}
    assert "w1" in lv.known  # failed, still known (its last status is probed)
    judged = lv.judge(60.5)
    assert "w1" not in lv.known and "w1" not in judged.failed | judged.doubt | judged.live


def test_a_new_epoch_is_a_fresh_heartbeat() -> None:
    lv = liveness()
    read_every_second(lv, 0.0, 10.0, {"w1": 1.0, "w2": 1.0, "w3": 1.0})
    lv.answered([Beat("w1", 2, 1.0), Beat("w2", 1, 1.0), Beat("w3", 1, 1.0)], 10.4, 10.5)
    assert "w1" in lv.judge(10.5).live
