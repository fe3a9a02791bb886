"""The machine lifecycle: one state enum, one event enum, one transition table.

Decides which state a machine is in after an event. Invariants: `destroyed` is
terminal; every other state may be destroyed; a crash of a started machine goes
back to `starting` (a local restart) and the restart policy, not this table,
decides when to give up (`fail`). It must not know about processes, ports or
time: the shell maps those to events.
"""

from __future__ import annotations

from enum import StrEnum


class MachineState(StrEnum):
    CREATED = "created"
    STARTING = "starting"
    STARTED = "started"
    STOPPING = "stopping"
    STOPPED = "stopped"
    SUSPENDING = "suspending"
    SUSPENDED = "suspended"
    DESTROYING = "destroying"
    DESTROYED = "destroyed"
    FAILED = "failed"


class MachineEvent(StrEnum):
    START = "start"  # asked to run (also resumes a suspended machine)
    READY = "ready"  # readiness check passed
    CRASH = "crash"  # process died unasked; the restart policy allowed a restart
    FAIL = "fail"  # start failed, or the restart policy gave up
    STOP = "stop"
    EXITED = "exited"  # the process is gone after a stop
    SUSPEND = "suspend"
    SUSPENDED = "suspended"  # the process is frozen
    DESTROY = "destroy"
    DESTROYED = "destroyed"


class IllegalTransition(Exception):
    """An event that the current state does not accept (HTTP 409)."""

    def __init__(self, state: MachineState, event: MachineEvent) -> None:
        super().__init__(f"cannot {event.value} a machine that is {state.value}")
        self.state = state
        self.event = event


S = MachineState
E = MachineEvent

TRANSITIONS: dict[tuple[MachineState, MachineEvent], MachineState] = {
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
}
for _state in MachineState:
    if _state not in (S.DESTROYING, S.DESTROYED):
        TRANSITIONS[(_state, E.DESTROY)] = S.DESTROYING

# States in which a process is expected to exist.
PROCESS_STATES = frozenset({S.STARTING, S.STARTED, S.SUSPENDING, S.SUSPENDED, S.STOPPING})


def next_state(state: MachineState, event: MachineEvent) -> MachineState:
    """The state after `event`, or IllegalTransition naming both."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(state, event) from None
