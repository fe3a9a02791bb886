"""Every (state, event) pair of the machine table."""

from __future__ import annotations

import itertools

import pytest

from agent.core.machine import (
    TRANSITIONS,
    IllegalTransition,
    MachineEvent,
    MachineState,
    next_state,
)

S = MachineState
E = MachineEvent

EXPECTED = {
    (S.CREATED, E.START): S.STARTING,
    (S.CREATED, E.FAIL): S.FAILED,
    (S.STARTING, E.READY): S.STARTED,
    (S.STARTING, E.CRASH): S.STARTING,
    (S.STARTING, E.FAIL): S.FAILED,
    (S.STARTING, E.STOP): S.STOPPING,
    (S.STARTED, E.CRASH): S.STARTING,
    (S.STARTED, E.FAIL): S.FAILED,
    (S.STARTED, E.STOP): S.STOPPING,
    (S.STARTED, E.SUSPEND): S.SUSPENDING,
    (S.STOPPING, E.EXITED): S.STOPPED,
    (S.STOPPED, E.START): S.STARTING,
    (S.SUSPENDING, E.SUSPENDED): S.SUSPENDED,
    (S.SUSPENDING, E.CRASH): S.STARTING,
    (S.SUSPENDING, E.FAIL): S.FAILED,
    (S.SUSPENDED, E.START): S.STARTING,
    (S.SUSPENDED, E.STOP): S.STOPPING,
    (S.FAILED, E.START): S.STARTING,
    (S.DESTROYING, E.DESTROYED): S.DESTROYED,
    **{
        (state, E.DESTROY): S.DESTROYING
        for state in S
        if state not in (S.DESTROYING, S.DESTROYED)
    },
}

ALL_PAIRS = list(itertools.product(S, E))


@pytest.mark.parametrize(("state", "event"), ALL_PAIRS, ids=[f"{s}-{e}" for s, e in ALL_PAIRS])
def test_every_state_event_pair_follows_the_table_or_is_illegal(
    state: MachineState, event: MachineEvent
) -> None:
    if (state, event) in EXPECTED:
        assert next_state(state, event) is EXPECTED[(state, event)]
    else:
        with pytest.raises(IllegalTransition) as info:
            next_state(state, event)
        assert state.value in str(info.value) and event.value in str(info.value)


def test_the_table_has_exactly_the_expected_transitions() -> None:
    assert TRANSITIONS == EXPECTED


def test_destroyed_is_terminal() -> None:
    assert not [pair for pair in TRANSITIONS if pair[0] is S.DESTROYED]


def test_every_state_except_destroyed_is_reachable_from_created() -> None:
    seen = {S.CREATED}
    frontier = [S.CREATED]
    while frontier:
        state = frontier.pop()
        for (src, _), dst in TRANSITIONS.items():
            if src is state and dst not in seen:
                seen.add(dst)
                frontier.append(dst)
    assert seen == set(S)
