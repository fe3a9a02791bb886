"""The exchange's transition table, every (phase, event) pair, and its retry and framing rules."""

from __future__ import annotations

import itertools

import pytest

from edge.core.exchange import (
    AGAIN,
    GIVE_UP,
    HOLD,
    TERMINAL,
    Event,
    IllegalTransition,
    Phase,
    advance,
    after_connect_failure,
    after_loss,
    resendable,
    response_framing,
)
from edge.core.framing import BODY_CHUNKED, BODY_LENGTH, BODY_NONE, BODY_UNTIL_CLOSE

P, E = Phase, Event
# Written out by hand (not derived from the module's table): what each phase may do.
EXPECTED: dict[tuple[Phase, Event], Phase] = {
    (P.NEW, E.HOLD): P.HELD, (P.NEW, E.PICK): P.CONNECTING, (P.NEW, E.SEND): P.FORWARDING,
    (P.NEW, E.FAIL): P.FAILED, (P.NEW, E.CLIENT_GONE): P.GONE,
    (P.HELD, E.PICK): P.CONNECTING, (P.HELD, E.SEND): P.FORWARDING,
    (P.HELD, E.FAIL): P.FAILED, (P.HELD, E.CLIENT_GONE): P.GONE,
    (P.RETRYING, E.HOLD): P.HELD, (P.RETRYING, E.PICK): P.CONNECTING,
    (P.RETRYING, E.SEND): P.FORWARDING, (P.RETRYING, E.FAIL): P.FAILED,
    (P.RETRYING, E.CLIENT_GONE): P.GONE,
    (P.CONNECTING, E.SEND): P.FORWARDING, (P.CONNECTING, E.RETRY): P.RETRYING,
    (P.CONNECTING, E.FAIL): P.FAILED, (P.CONNECTING, E.CLIENT_GONE): P.GONE,
    (P.FORWARDING, E.HEAD): P.RESPONDING, (P.FORWARDING, E.UPGRADE): P.TUNNEL,
    (P.FORWARDING, E.RETRY): P.RETRYING, (P.FORWARDING, E.FAIL): P.FAILED,
    (P.FORWARDING, E.CLIENT_GONE): P.GONE,
    (P.RESPONDING, E.END): P.DONE, (P.RESPONDING, E.FAIL): P.FAILED,
    (P.RESPONDING, E.CLIENT_GONE): P.GONE,
    (P.TUNNEL, E.END): P.DONE, (P.TUNNEL, E.FAIL): P.FAILED, (P.TUNNEL, E.CLIENT_GONE): P.GONE,
    (P.DONE, E.FAIL): P.DONE, (P.DONE, E.CLIENT_GONE): P.DONE,
    (P.FAILED, E.FAIL): P.FAILED, (P.FAILED, E.CLIENT_GONE): P.FAILED,
    (P.GONE, E.FAIL): P.GONE, (P.GONE, E.CLIENT_GONE): P.GONE,
}


@pytest.mark.parametrize(("phase", "event"), list(itertools.product(Phase, Event)),
                         ids=lambda v: v.name)
def test_every_phase_and_event_pair(phase: Phase, event: Event) -> None:
    expected = EXPECTED.get((phase, event))
    if expected is None:
        with pytest.raises(IllegalTransition) as raised:
            advance(phase, event)
        assert raised.value.phase is phase and raised.value.event is event
        assert phase.name in str(raised.value) and event.name in str(raised.value)
    else:
        assert advance(phase, event) is expected


def test_a_held_request_cannot_be_held_twice_nor_answered_by_a_machine_before_sending() -> None:
    for event in (E.HOLD, E.HEAD, E.END, E.RETRY):
        with pytest.raises(IllegalTransition):
            advance(P.HELD, event)


def test_terminal_phases_take_only_late_endings() -> None:
    assert {P.DONE, P.FAILED, P.GONE} == TERMINAL
    for phase in TERMINAL:
        legal = {event for event in Event if (phase, event) in EXPECTED}
        assert legal == {E.FAIL, E.CLIENT_GONE}


def test_every_live_phase_can_fail_and_lose_its_client() -> None:
    for phase in set(Phase) - TERMINAL:
        assert advance(phase, E.FAIL) is P.FAILED
        assert advance(phase, E.CLIENT_GONE) is P.GONE


# -- retries ---------------------------------------------------------------------------


def test_only_idempotent_bodiless_requests_with_no_answer_yet_may_go_out_twice() -> None:
    assert resendable(b"GET", BODY_NONE, False)
    assert resendable(b"DELETE", BODY_NONE, False)
    assert not resendable(b"POST", BODY_NONE, False)
    assert not resendable(b"PUT", BODY_LENGTH, False)
    assert not resendable(b"GET", BODY_NONE, True)


def test_a_failed_connect_tries_another_machine_then_holds_never_gives_up() -> None:
    assert after_connect_failure(1, 3) == AGAIN
    assert after_connect_failure(2, 3) == AGAIN
    assert after_connect_failure(3, 3) == HOLD


def test_a_lost_connection_gives_up_once_bytes_came_or_the_request_cannot_be_resent() -> None:
    assert after_loss(True, True, False, 0, 3, 0, 2) == (GIVE_UP, False)
    assert after_loss(False, False, False, 0, 3, 0, 2) == (GIVE_UP, False)


def test_a_lost_fresh_connection_counts_as_an_attempt_a_reused_one_does_not() -> None:
    assert after_loss(True, False, False, 0, 3, 0, 2) == (AGAIN, True)
    assert after_loss(True, False, False, 2, 3, 1, 2) == (HOLD, True)
    assert after_loss(True, False, True, 2, 3, 1, 2) == (AGAIN, False)


def test_a_request_that_every_machine_loses_is_resent_max_resends_times_then_gives_up() -> None:
    """A request of death: each machine it reaches closes without answering. It goes out
    1 + max_resends times in all, whether the connections were fresh or pooled, held
    or not, never once more."""
    for max_resends in (0, 1, 2, 5):
        for reused in (False, True):
            resends, attempts, sent = 0, 0, 1
            while True:
                where, counts = after_loss(True, False, reused, attempts, 3, resends,
                                           max_resends)
                if where == GIVE_UP:
                    break
                resends, attempts, sent = resends + 1, attempts + counts, sent + 1
            assert sent == 1 + max_resends, (max_resends, reused)


# -- framing ---------------------------------------------------------------------------


def test_a_sized_response_keeps_its_length_and_the_connection() -> None:
    assert response_framing(BODY_LENGTH, 12, False, True, False) == (
        b"Content-Length: 12\r\n", False, False)


def test_an_unsized_response_is_rechunked_for_http11_and_closes_for_http10() -> None:
    assert response_framing(BODY_UNTIL_CLOSE, 0, False, True, False) == (
        b"Transfer-Encoding: chunked\r\n", True, False)
    assert response_framing(BODY_CHUNKED, 0, True, True, False) == (
        b"Connection: close\r\n", False, True)


def test_http10_keep_alive_is_said_and_an_unread_request_body_closes() -> None:
    assert response_framing(BODY_NONE, 0, True, True, False) == (
        b"Connection: keep-alive\r\n", False, False)
    assert response_framing(BODY_LENGTH, 1, False, False, False) == (
        b"Content-Length: 1\r\nConnection: close\r\n", False, True)
