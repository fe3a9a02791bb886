"""Accept or decline an offer to run a machine: backpressure, never a queue.

Decides, from the agent's state and its capacity, whether a new machine fits.
Invariants: capacity is reserved at accept, so the sum of reservations never
exceeds capacity; the same offer key always gets the same answer (the machine
it created); a draining agent accepts nothing new. It must not know about
HTTP, ids generation or time.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.core.records import MachineSpec
from agent.core.state import AgentState


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
    reason: str  # "no_capacity" | "draining"
    message: str


def decide_offer(
    state: AgentState,
    capacity: Capacity,
    key: str,
    spec: MachineSpec,
    new_id: str,
    draining: bool,
) -> Accept | Decline:
    """Accept under `new_id`, accept the earlier machine for a repeated key, or decline."""
    if key and key in state.offers:
        return Accept(state.offers[key], existing=True)
    if draining:
        return Decline("draining", "this worker is draining and takes no new machines")
    cpus, memory = state.reserved()
    free_cpus = capacity.cpus - cpus
    free_memory = capacity.memory_mb - memory
    if spec.guest.cpus > free_cpus + 1e-9 or spec.guest.memory_mb > free_memory:
        return Decline(
            "no_capacity",
            f"needs {spec.guest.cpus:g} cpus / {spec.guest.memory_mb} MB, "
            f"free {max(free_cpus, 0):g} cpus / {max(free_memory, 0)} MB",
        )
    return Accept(new_id, existing=False)
