"""The TLS door's handshakes (edge/core/handshakes.py): the cap on those in progress, and
the trim after a burst of failed ones."""

from __future__ import annotations

from edge.core.handshakes import TRIM_AFTER_FAILED, Handshakes


def test_connections_past_the_limit_are_refused_until_a_handshake_ends() -> None:
    handshakes = Handshakes(limit=2)
    assert handshakes.admit() and handshakes.admit()
    assert not handshakes.admit()
    assert not handshakes.admit()
    assert (handshakes.in_progress, handshakes.refused) == (2, 2)
    handshakes.ended(done=True)
    assert handshakes.admit()
    assert handshakes.in_progress == 2


def test_a_burst_of_failed_handshakes_arms_one_trim() -> None:
    handshakes = Handshakes(limit=10 * TRIM_AFTER_FAILED)
    for _ in range(3 * TRIM_AFTER_FAILED):
        assert handshakes.admit()
    armed = [handshakes.ended(done=False) for _ in range(3 * TRIM_AFTER_FAILED)]
    assert armed.index(True) == TRIM_AFTER_FAILED - 1
    assert armed.count(True) == 1  # armed once until it is carried out
    assert handshakes.in_progress == 0


def test_after_a_trim_another_burst_arms_the_next() -> None:
    handshakes = Handshakes(limit=10 * TRIM_AFTER_FAILED)
    for _ in range(2 * TRIM_AFTER_FAILED):
        handshakes.admit()
    assert any([handshakes.ended(done=False) for _ in range(TRIM_AFTER_FAILED)])
    handshakes.trimmed()
    armed = [handshakes.ended(done=False) for _ in range(TRIM_AFTER_FAILED)]
    assert armed == [False] * (TRIM_AFTER_FAILED - 1) + [True]


def test_handshakes_done_do_not_count_toward_a_trim() -> None:
    handshakes = Handshakes(limit=10 * TRIM_AFTER_FAILED)
    for _ in range(5 * TRIM_AFTER_FAILED):
        handshakes.admit()
        assert not handshakes.ended(done=True)
    assert handshakes.failed_since_trim == 0


def test_a_trim_during_which_any_failed_is_followed_by_another_until_one_waits_alone() -> None:
    # the burst goes on past its trim: its last few (fewer than TRIM_AFTER_FAILED) must
    # still be given back, by the trim that follows
    handshakes = Handshakes(limit=10 * TRIM_AFTER_FAILED)
    for _ in range(TRIM_AFTER_FAILED + 3):
        handshakes.admit()
    assert [handshakes.ended(done=False) for _ in range(TRIM_AFTER_FAILED)][-1]
    assert not handshakes.ended(done=False)  # one more while the trim waits
    assert handshakes.trimmed()  # so the next is armed at once
    assert not handshakes.ended(done=False)  # and fails after it are within the next
    assert not handshakes.ended(done=False)
    assert handshakes.trimmed()
    assert not handshakes.trimmed()  # nothing failed while it waited: none armed
    assert (handshakes.trim_armed, handshakes.failed_since_trim) == (False, 0)
    armed = [handshakes.ended(done=False) for _ in range(TRIM_AFTER_FAILED - 1)]
    assert not any(armed)  # a few after a quiet spell arm nothing


def test_a_burst_that_ends_before_its_trim_is_trimmed_once() -> None:
    handshakes = Handshakes(limit=10 * TRIM_AFTER_FAILED)
    for _ in range(TRIM_AFTER_FAILED):
        handshakes.admit()
    assert [handshakes.ended(done=False) for _ in range(TRIM_AFTER_FAILED)][-1]
    assert not handshakes.trimmed()
