"""The `Workers` port (placement/ports/workers.py) answered from memory, for tests without
processes: each worker is an agent's state (agent/core/state.py) changed by the agent's
own pure rules — offers and starts judged by agent/core/offers.py, transitions by the
state table of agent/core/machine.py, fencing by `stale_fence`, specs validated as the
agent's HTTP side validates them. What a real agent does over time (a boot, a stop's
exit, a destroy) happens at once: a start answers `started`, a stop `stopped`. Given a
registry, each worker publishes its machines' records there as an agent does (unsealed;
a destroyed machine's record deleted) — what placement's wakes read first.

The same contract suite runs on it and on `HttpWorkers` against a real agent
(tests/integration/test_placement_workers_port.py).
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.adapters.http import spec_from_offer
from agent.api import (
    EventView,
    HealthView,
    MachineGone,
    MachineView,
    OfferRequest,
    PulledImage,
    PulledLayer,
)
from agent.core import offers
from agent.core.machine import IllegalTransition, MachineEvent, MachineState
from agent.core.records import Boot, Fenced
from agent.core.state import AgentState, Machine, stale_fence, transition_record
from agent.errors import AgentError
from ground.registry import MachineRecord, Registry, WorkerStatus
from ground.registry.types import MachineEvent as RegistryEvent
from placement.adapters.agents import current_fence
from placement.ports.workers import LogChunk, Refused, Unreachable

E = MachineEvent


@dataclass
class MemoryWorker:
    """One worker: its id and region, its capacity, the agent's state; `down` makes every
    call to it Unreachable (as a dead or partitioned agent); `draining` declines offers."""

    id: str
    cpus: float = 2.0
    memory_mb: int = 2048
    region: str = "local"
    state: AgentState = field(default_factory=AgentState)
    down: bool = False
    draining: bool = False
    pulled: set[str] = field(default_factory=set)  # image refs pulled here
    logs: dict[str, bytes] = field(default_factory=dict)  # machine -> its log


class MemoryWorkers:
    """Workers by URL (`mem://ID`); the records carry a counter as their time (1, 2, ...)."""

    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = registry
        self.workers: dict[str, MemoryWorker] = {}
        self._ids = itertools.count(1)
        self._now = itertools.count(1)
        self.calls: list[tuple[str, str]] = []  # (call, url), in order
        # call -> what befalls the first worker it reaches, before it answers (a host
        # that dies, or starts draining, just then)
        self.on_first: dict[str, Callable[[MemoryWorker], None]] = {}

    def add(self, worker_id: str, **fields: object) -> str:
        """A worker, booted (epoch 1); its URL."""
        worker = MemoryWorker(worker_id, **fields)  # type: ignore[arg-type]
        worker.state.apply(Boot(1, self.clock()))
        url = f"mem://{worker_id}"
        self.workers[url] = worker
        return url

    def clock(self) -> float:
        return float(next(self._now))

    def _worker(self, call: str, url: str) -> MemoryWorker | Unreachable:
        self.calls.append((call, url))
        worker = self.workers.get(url)
        befall = self.on_first.pop(call, None)
        if befall is not None and worker is not None:
            befall(worker)
        if worker is None or worker.down:
            return Unreachable(f"a worker did not answer {call}")
        return worker

    def _view(self, worker: MemoryWorker, machine: Machine) -> MachineView:
        running = machine.state in (MachineState.STARTED, MachineState.SUSPENDED)
        return MachineView(
            id=machine.id, app=machine.spec.app, worker=worker.id, region=worker.region,
            state=machine.state.value, image=machine.spec.image,
            image_digest=machine.image_digest,
            address=f"{worker.id}.machines:{8000 + int(machine.id[-4:], 16) % 1000}"
            if running else "",
            pid=0, created_at=machine.created_at, updated_at=machine.updated_at,
            guest=machine.spec.guest,
            events=[EventView(e.state.value, e.event, e.at, e.reason) for e in machine.events],
            app_uid=machine.spec.app_uid, release=machine.spec.release,
            for_spares=machine.spec.for_spares)

    def status(self, url: str) -> WorkerStatus:
        """The worker's heartbeat as its agent would publish it now."""
        worker = self.workers[url]
        cpus, memory = worker.state.reserved()
        return WorkerStatus(id=worker.id, epoch=worker.state.epoch, region=worker.region,
                            url=url, cpus=worker.cpus, memory_mb=worker.memory_mb,
                            reserved_cpus=cpus, reserved_memory_mb=memory,
                            draining=worker.draining, updated_at=time.time(),
                            machines=len(worker.state.machines))

    async def _published(self, worker: MemoryWorker, machine: Machine
                         ) -> None:
        if self.registry is None:
            return
        if machine.id not in worker.state.machines:
            await self.registry.delete_machine(machine.spec.app, machine.id)
            return
        view = self._view(worker, machine)
        await self.registry.put_machine(MachineRecord(
            id=view.id, app=view.app, worker=view.worker, region=view.region,
            state=view.state, image_digest=view.image_digest, created_at=view.created_at,
            updated_at=view.updated_at, address=view.address, epoch=worker.state.epoch,
            events=[RegistryEvent(e.state, e.at, e.reason) for e in view.events],
            app_uid=view.app_uid, release=view.release))

    def _fenced(self, worker: MemoryWorker, app: str) -> Refused | None:
        token = current_fence()
        why = stale_fence(worker.state, app, token)
        if why:
            return Refused(409, "stale_fence", why)
        if token is not None and token > worker.state.fences.get(app, 0):
            worker.state.apply(Fenced(app, token, self.clock()))
        return None

    def _machine(self, worker: MemoryWorker, machine_id: str) -> Machine | Refused:
        machine = worker.state.machines.get(machine_id)
        if machine is None:
            return Refused(404, "not_found", f"no machine {machine_id}")
        return machine

    def _machine_call(self, call: str, url: str, machine_id: str
                      ) -> tuple[MemoryWorker, Machine] | Refused | Unreachable:
        """The worker and the machine a call that changes it acts on, or why it cannot:
        the worker away, the machine unknown, or the call's fencing token stale."""
        worker = self._worker(call, url)
        if isinstance(worker, Unreachable):
            return worker
        machine = self._machine(worker, machine_id)
        if isinstance(machine, Refused):
            return machine
        return self._fenced(worker, machine.spec.app) or (worker, machine)

    def _step(self, worker: MemoryWorker, machine: Machine, *events: MachineEvent
              ) -> Refused | None:
        """Apply `events` in order (the first judged by the state table: 409 if illegal)."""
        try:
            for event in events:
                worker.state.apply(transition_record(machine, event, self.clock()))
        except IllegalTransition as exc:
            return Refused(409, "illegal_transition", str(exc))
        return None

    # -- the port --------------------------------------------------------------------------

    async def offer(self, url: str, offer: OfferRequest
                    ) -> MachineView | Refused | Unreachable:
        worker = self._worker("POST /v1/offers", url)
        if isinstance(worker, Unreachable):
            return worker
        try:
            spec = spec_from_offer(offer)
        except AgentError as exc:
            return Refused(exc.status, exc.code, exc.message)
        fenced = self._fenced(worker, spec.app)
        if fenced is not None:
            return fenced
        new_id = offer.id or f"{next(self._ids):014x}"
        decision = offers.decide_offer(
            worker.state, offers.Capacity(worker.cpus, worker.memory_mb), offer.key, spec,
            new_id, worker.draining, needs_room=offer.start or not offer.spare)
        if isinstance(decision, offers.Decline):
            status = 409 if decision.reason != "draining" else 503
            return Refused(status, decision.reason, decision.message)
        machine_id = decision.machine_id
        if not decision.existing:
            for record in offers.accepted_records(machine_id, spec, offer.key, self.clock(),
                                                  offer.start):
                worker.state.apply(record)
            machine = worker.state.machines[machine_id]
            worker.logs[machine_id] = f"machine {machine_id} of {spec.app}\n".encode()
            if offer.start:
                self._step(worker, machine, E.READY)
            await self._published(worker, machine)
        return self._view(worker, worker.state.machines[machine_id])

    async def start(self, url: str, machine_id: str, wait_s: float,
                    timeout_s: float | None = None) -> MachineView | Refused | Unreachable:
        found = self._machine_call("POST /v1/machines/{id}/start", url, machine_id)
        if isinstance(found, (Refused, Unreachable)):
            return found
        worker, machine = found
        if machine.state is MachineState.STARTED:  # start?wait_s takes a started machine
            return self._view(worker, machine)
        try:
            transition_record(machine, E.START, 0.0)  # 409 before room is judged
        except IllegalTransition as exc:
            return Refused(409, "illegal_transition", str(exc))
        declined = offers.decide_start(worker.state,
                                       offers.Capacity(worker.cpus, worker.memory_mb), machine)
        if declined is not None:
            return Refused(409, declined.reason, declined.message)
        refused = self._step(worker, machine, E.START, E.READY)
        await self._published(worker, machine)
        return refused or self._view(worker, machine)

    async def stop(self, url: str, machine_id: str) -> MachineView | Refused | Unreachable:
        return await self._change("stop", url, machine_id, E.STOP, E.EXITED)

    async def suspend(self, url: str, machine_id: str) -> MachineView | Refused | Unreachable:
        return await self._change("suspend", url, machine_id, E.SUSPEND, E.SUSPENDED)

    async def destroy(self, url: str, machine_id: str) -> MachineView | Refused | Unreachable:
        found = self._machine_call("DELETE /v1/machines/{id}", url, machine_id)
        if isinstance(found, (Refused, Unreachable)):
            return found
        worker, machine = found
        refused = self._step(worker, machine, E.DESTROY)
        if refused is not None:
            return refused
        view = self._view(worker, machine)
        self._step(worker, machine, E.DESTROYED)
        worker.logs.pop(machine_id, None)
        await self._published(worker, machine)
        return view

    async def _change(self, call: str, url: str, machine_id: str,
                      *events: MachineEvent) -> MachineView | Refused | Unreachable:
        found = self._machine_call(f"POST /v1/machines/{{id}}/{call}", url, machine_id)
        if isinstance(found, (Refused, Unreachable)):
            return found
        worker, machine = found
        refused = self._step(worker, machine, *events)
        await self._published(worker, machine)
        return refused or self._view(worker, machine)

    async def pull(self, url: str, ref: str, timeout_s: float
                   ) -> PulledImage | Refused | Unreachable:
        worker = self._worker("POST /v1/images/pull", url)
        if isinstance(worker, Unreachable):
            return worker
        worker.pulled.add(ref)
        digest = "sha256:" + hashlib.sha256(ref.encode()).hexdigest()
        return PulledImage(ref=ref, digest=digest, layers=[PulledLayer(digest, 1024)])

    async def machine(self, url: str, machine_id: str) -> MachineView | Refused | Unreachable:
        worker = self._worker("GET /v1/machines/{id}", url)
        if isinstance(worker, Unreachable):
            return worker
        machine = self._machine(worker, machine_id)
        return machine if isinstance(machine, Refused) else self._view(worker, machine)

    async def wait(self, url: str, machine_id: str, state: str, timeout_s: float
                   ) -> MachineView | MachineGone | Refused | Unreachable:
        worker = self._worker("GET /v1/machines/{id}/wait", url)
        if isinstance(worker, Unreachable):
            return worker
        machine = worker.state.machines.get(machine_id)
        if machine is None:
            return MachineGone(machine_id, "destroyed") if state == "destroyed" else \
                Refused(404, "not_found", f"no machine {machine_id}")
        if machine.state.value == state:
            return self._view(worker, machine)
        return Refused(408, "timeout", f"machine {machine_id} is {machine.state.value}, "
                                       f"not {state}")  # nothing changes by itself here

    async def logs(self, url: str, machine_id: str, offset: int, max_bytes: int
                   ) -> LogChunk | Refused | Unreachable:
        worker = self._worker("GET /v1/machines/{id}/logs", url)
        if isinstance(worker, Unreachable):
            return worker
        if machine_id not in worker.state.machines:
            return Refused(404, "not_found", f"no machine {machine_id}")
        log = worker.logs.get(machine_id, b"")
        start = max(0, len(log) - max_bytes) if offset < 0 else min(offset, len(log))
        return LogChunk(start, log[start:start + max_bytes])

    async def machines(self, url: str, app: str) -> list[MachineView] | Refused | Unreachable:
        worker = self._worker("GET /v1/machines", url)
        if isinstance(worker, Unreachable):
            return worker
        return [self._view(worker, m) for m in worker.state.machines.values()
                if m.spec.app == app]

    async def health(self, url: str, timeout_s: float) -> HealthView | Refused | Unreachable:
        worker = self._worker("GET /healthz", url)
        if isinstance(worker, Unreachable):
            return worker
        return HealthView(ok=True, epoch=worker.state.epoch)
