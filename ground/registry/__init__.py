"""The shared registry: a replicated, advisory view of workers, layers, machines and apps.

Agents are the truth for machines and placement's store for app configs; the
registry is a cache of both. A stale entry costs a declined offer or a retried
connect, never a wrong result.
"""

from ground.registry.port import Registry
from ground.registry.types import (
    Change,
    MachineFacts,
    MachineRecord,
    PlacementAdvert,
    WorkerFacts,
    WorkerStatus,
    facts_of,
)

__all__ = [
    "Change", "MachineFacts", "MachineRecord", "PlacementAdvert", "Registry", "WorkerFacts",
    "WorkerStatus", "facts_of",
]
