"""Accept or decline an offer to run a machine, or a start: backpressure, never a queue.

Decides, from the agent's state and its capacity, whether a machine fits when
it is to run. Invariants: a machine to be started is checked against what the
running ones hold (state.held), so the sum never exceeds capacity; a stopped
machine holds nothing, and starting it again is checked like a new one (a
worker that cannot fit it declines, and the machine stays stopped); a spare
(created, not started) needs no room until it starts; the same offer key always
gets the same answer (the machine it created); a draining agent accepts nothing
new. It must not know about HTTP, ids generation or time.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.core.machine import MachineEvent, MachineState, next_state
from agent.core.records import Created, MachineSpec, Record, Transition
from agent.core.state import AgentState, Machine, held


@dataclass(frozen=True)
class Capacity:
    cpus: float
    memory_mb: int


@dataclass(frozen=True)
class Accept:
    machine_id: str
    existing: bool  # True when the offer key was seen before (nothing new is created)


@dataclass(frozen=True)
class Decline:
    reason: str  # "no_capacity" | "draining" | "id_taken"
    message: str


def decide_offer(
    state: AgentState,
    capacity: Capacity,
    key: str,
    spec: MachineSpec,
    new_id: str,
    draining: bool,
    needs_room: bool = True,
) -> Accept | Decline:
    """Accept under `new_id`, accept the earlier machine for a repeated key, or decline.
    A machine about to run must fit now (`needs_room`); a spare, kept stopped, need not."""
    if key and key in state.offers:
        return Accept(state.offers[key], existing=True)
    if draining:
        return Decline("draining", "this worker is draining and takes no new machines")
    if new_id in state.machines:  # an id placement chose, already another offer's
        return Decline("id_taken", f"machine id {new_id} is taken on this worker")
    if needs_room:
        refused = _room(state, capacity, spec.guest.cpus, spec.guest.memory_mb)
        if refused is not None:
            return refused
    return Accept(new_id, existing=False)


def accepted_records(machine_id: str, spec: MachineSpec, key: str, at: float,
                     start: bool) -> list[Record]:
    """What an accepted offer writes: the machine's creation and, to start it at once, its
    start — one write, so the log never holds a machine offered to start but not starting."""
    records: list[Record] = [Created(machine_id, spec, key, at)]
    if start:
        event = MachineEvent.START
        records.append(Transition(machine_id, event.value,
                                  next_state(MachineState.CREATED, event).value, at, ""))
    return records


def decide_start(state: AgentState, capacity: Capacity, machine: Machine) -> Decline | None:
    """None when `machine` may start here now: what it will hold beyond what it holds
    already (a suspended one keeps its memory) fits beside the others."""
    cpus, memory = held(machine)
    return _room(state, capacity, machine.spec.guest.cpus - cpus,
                 machine.spec.guest.memory_mb - memory)


def _room(state: AgentState, capacity: Capacity, cpus: float, memory_mb: int
          ) -> Decline | None:
    reserved_cpus, reserved_memory = state.reserved()
    free_cpus = capacity.cpus - reserved_cpus
    free_memory = capacity.memory_mb - reserved_memory
    if cpus > free_cpus + 1e-9 or memory_mb > free_memory:
        return Decline(
            "no_capacity",
            f"needs {cpus:g} cpus / {memory_mb} MB more, "
            f"free {max(free_cpus, 0):g} cpus / {max(free_memory, 0)} MB",
        )
    return None
