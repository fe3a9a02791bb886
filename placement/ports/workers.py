"""The port between placement and its workers: what placement may ask a worker, and the
answers it gets, typed (the agent's wire types, agent/api.py).

A worker is named by its agent's URL. Every call answers one of three things:

- what was asked for (a `MachineView`, a `PulledImage`, a `HealthView`, a list of
  machine views): the worker did it;
- `Refused(status, code, message)`: the worker answered and did not do it — its code
  says why (`no_capacity`, `draining`, `stale_fence`, `timeout`, `not_found`,
  `illegal_transition`, `machine_failed`, `disk_full`, ...), its message is its own words;
- `Unreachable(message)`: no answer (connect refused, a timeout, a broken connection);
  the message names the call, never the worker's address (it may reach an app owner).

Only `placement/adapters/agents.py` (HTTP, signed, fenced) knows paths and status codes;
`tests/support/memory_workers.py` answers the same from memory for unit tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from agent.api import HealthView, MachineGone, MachineView, OfferRequest, PulledImage


@dataclass(frozen=True, slots=True)
class Refused:
    """The worker answered and refused: its HTTP status, its error code, its message."""

    status: int
    code: str
    message: str

    def declined(self) -> bool:
        """No room on that worker now (another worker may have it)."""
        return self.code == "no_capacity"

    def gone(self) -> bool:
        """The worker does not know the machine (destroyed and forgotten, or never there)."""
        return self.status == 404


@dataclass(frozen=True, slots=True)
class LogChunk:
    """A piece of a machine's log: where it starts in the whole log, and its bytes."""

    start: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Unreachable:
    """No answer from the worker (the message names the call, not the worker)."""

    message: str


class Workers(Protocol):
    """What placement asks its workers; see the module's docstring for the answers."""

    async def offer(self, url: str, offer: OfferRequest
                    ) -> MachineView | Refused | Unreachable:
        """Make a machine (and start it, unless `offer.start` is false); idempotent by
        `offer.key`."""
        ...

    async def start(self, url: str, machine_id: str, wait_s: float,
                    timeout_s: float | None = None) -> MachineView | Refused | Unreachable:
        """Start the machine and answer once it is started (at most `wait_s`: then
        `Refused` `timeout`; 0: at once); `timeout_s`: how long its answer may take
        (None: the port's own bound)."""
        ...

    async def stop(self, url: str, machine_id: str) -> MachineView | Refused | Unreachable:
        ...

    async def suspend(self, url: str, machine_id: str) -> MachineView | Refused | Unreachable:
        ...

    async def destroy(self, url: str, machine_id: str) -> MachineView | Refused | Unreachable:
        ...

    async def pull(self, url: str, ref: str, timeout_s: float
                   ) -> PulledImage | Refused | Unreachable:
        ...

    async def machine(self, url: str, machine_id: str) -> MachineView | Refused | Unreachable:
        ...

    async def wait(self, url: str, machine_id: str, state: str, timeout_s: float
                   ) -> MachineView | MachineGone | Refused | Unreachable:
        """Answer once the machine is in `state` (`MachineGone` for `destroyed`); a long
        poll, of at most `timeout_s` (then `Refused` `timeout`)."""
        ...

    async def logs(self, url: str, machine_id: str, offset: int, max_bytes: int
                   ) -> LogChunk | Refused | Unreachable:
        """At most `max_bytes` of the machine's log from `offset` (-1: its tail)."""
        ...

    async def machines(self, url: str, app: str) -> list[MachineView] | Refused | Unreachable:
        """The machines the worker holds for `app` (any incarnation of the name)."""
        ...

    async def health(self, url: str, timeout_s: float) -> HealthView | Refused | Unreachable:
        """Whether the worker's agent answers, and under which epoch."""
        ...
