"""Publishes the agent's truth to the shared registry: heartbeats, layers, machines.

The registry is a replicated view; publishing failures are logged and repaired
by the periodic full resync, never allowed to block or fail a machine operation.
Readiness (/readyz) is the publisher's word: the op log is writable, this worker
has been published since start, and the registry answers now.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable

import msgspec

from agent.api import EventView, MachineView, StatusView
from agent.core.machine import MachineState
from agent.core.state import Machine
from agent.service import Agent
from ground.auth import tickets
from ground.registry import (
    MachineFacts,
    MachineRecord,
    Registry,
    WorkerFacts,
    WorkerStatus,
    facts_of,
)
from ground.registry.generation import GenerationWatch
from ground.registry.readiness import registry_answers
from ground.registry.types import MachineEvent as RegistryEvent

log = logging.getLogger("thaw.agent")

HEARTBEATS_PER_TTL = 3
RESYNC_EVERY_BEATS = 10
# States a machine passes through on its way to another: a change to one is held up to
# `publish_coalesce_s` for the state it is heading to, so that a resume's `starting` and
# `started` (a thaw takes well under a millisecond) are one registry write, not two, and
# every reader (placement's reconciler, each edge's feed) reads once.
PASSING = frozenset({MachineState.STARTING, MachineState.STOPPING, MachineState.SUSPENDING,
                     MachineState.DESTROYING})


class Publisher:
    def __init__(self, agent: Agent, registry: Registry, url: str) -> None:
        self.agent = agent
        self.registry = registry
        self.url = url
        self._dirty: set[str] = set()
        self._apps: dict[str, str] = {}  # machine id -> app, to delete records of destroyed ones
        self._layers_dirty = True
        self._kick = asyncio.Event()
        self.generation = GenerationWatch()
        self._republishing: str | None = None  # a generation whose republish is under way
        self.published = False  # a heartbeat reached the registry since start

    def machine_changed(self, mid: str) -> None:
        machine = self.agent.state.machines.get(mid)
        if machine is not None:
            self._apps[mid] = machine.spec.app
        self._dirty.add(mid)
        self._kick.set()

    def layers_changed(self) -> None:
        self._layers_dirty = True
        self._kick.set()

    def _observed(self) -> tuple[dict[str, int], Counter[str]]:
        """The cache's layers (digest -> bytes) and the machines by state, with the
        machine and cache gauges set from them."""
        agent = self.agent
        layers = agent.cache.layers()
        agent.metrics.layer_bytes.set(sum(layers.values()))
        counts = Counter(m.state.value for m in agent.state.machines.values())
        for state in MachineState:
            agent.metrics.machines.labels(state.value).set(counts.get(state.value, 0))
        return layers, counts

    def facts(self, counts: Counter[str]) -> WorkerFacts:
        """What this worker says of itself to every reader (placement and /v1/status);
        `counts`: its machines by state."""
        agent = self.agent
        cpus, memory = agent.state.reserved()
        starting = counts[MachineState.STARTING.value]
        return WorkerFacts(
            id=agent.worker_id, epoch=agent.state.epoch, region=agent.config.region,
            url=self.url, cpus=agent.config.cpus, memory_mb=agent.config.memory_mb,
            reserved_cpus=cpus, reserved_memory_mb=memory, machines_starting=starting,
            machines_running=starting + counts[MachineState.STARTED.value],
            machines=len(agent.state.machines), draining=agent.draining,
            disk_full=agent.disk_short(), pull_blocked=agent.cache.pull_blocked(),
        )

    def status(self) -> StatusView:
        agent = self.agent
        layers, counts = self._observed()
        return StatusView(
            **facts_of(self.facts(counts)), machine_states=dict(counts),
            driver=agent.driver.name, isolated=agent.driver.isolated, layers=len(layers),
            layer_bytes=sum(layers.values()),
        )

    def worker_status(self) -> WorkerStatus:
        layers, counts = self._observed()
        return WorkerStatus(
            **facts_of(self.facts(counts)), layers=layers, updated_at=self.agent.clock(),
            # Whole pulls' rate (bytes downloaded over resolve-to-unpacked time, an EWMA),
            # not the downloads' alone: what placement predicts a machine's pull by.
            pull_bytes_per_s=round(self.agent.cache.stats.bytes_per_s, 1),
            generation=self.generation.known or "",
        )

    async def run(self) -> None:
        """Heartbeat every interval; push changed machines as soon as they change."""
        interval = self.agent.config.heartbeat_interval_s
        loop = asyncio.get_running_loop()
        next_beat = loop.time()
        beats = 0
        while True:
            if loop.time() >= next_beat:
                if beats % RESYNC_EVERY_BEATS == 0:
                    self._dirty.update(self.agent.state.machines)
                    self._layers_dirty = True
                await self._guarded(self._heartbeat(interval))
                beats += 1
                next_beat = loop.time() + interval
            await self._settle(min(next_beat, loop.time() + self.agent.config.publish_coalesce_s))
            await self._guarded(self._flush())
            self._kick.clear()
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel
            # that races with the event, and stop() would then wait forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, next_beat - loop.time())):
                    await self._kick.wait()

    def _passing(self) -> bool:
        machines = self.agent.state.machines
        return any(mid in machines and machines[mid].state in PASSING for mid in self._dirty)

    async def _settle(self, until: float) -> None:
        """Wait (until `until`, loop time) while a changed machine is in a passing state:
        its next change, usually a moment later, goes out in the same flush."""
        loop = asyncio.get_running_loop()
        while self._passing() and loop.time() < until:
            self._kick.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(until - loop.time()):
                    await self._kick.wait()

    async def _heartbeat(self, interval: float) -> None:
        token = await self.registry.publish_worker(self.worker_status(),
                                                   interval * HEARTBEATS_PER_TTL)
        self.published = True
        self._notice(token)

    async def readiness(self) -> tuple[bool, str]:
        """(ready, why not): the op log takes records, this worker was published (its
        machines recovered first), and the registry answers now."""
        broken = self.agent.journal.oplog.broken
        if broken:
            return False, f"the op log is broken: {broken}"
        if not self.published:
            return False, "not yet published to the registry"
        return await registry_answers(self.registry.generation())

    def _notice(self, token: str) -> None:
        """The generation a heartbeat was answered with: a new one means the view was lost
        (and the first one, that nothing is published yet): publish everything again."""
        if token in (self.generation.known, self._republishing):
            return
        if self.generation.lost(token):
            log.warning("the registry was lost (new generation): publishing this worker, its "
                        "layers and its %d machines again", len(self.agent.state.machines))
        self._dirty.update(self.agent.state.machines)
        self._layers_dirty = True
        self._republishing = token

    async def _flush(self) -> None:
        if self._layers_dirty:
            # Placement scores by layers: publish both views of the change at once.
            self._layers_dirty = False
            await self.registry.set_worker_layers(self.agent.worker_id, self.agent.cache.layers())
            await self._heartbeat(self.agent.config.heartbeat_interval_s)
        while self._dirty:
            mid = self._dirty.pop()
            machine = self.agent.state.machines.get(mid)
            if machine is None:
                app = self._apps.pop(mid, None)
                if app is not None:
                    try:
                        await self.registry.delete_machine(app, mid)
                    except Exception:
                        self._apps[mid] = app  # deleted again at the next flush
                        self._dirty.add(mid)
                        raise
                continue
            try:
                await self.registry.put_machine(machine_record(self.agent, machine))
            except Exception:
                self._dirty.add(mid)  # sent again at the next flush
                raise
        if self._republishing is not None:  # every record is out again: say so at once
            self.generation.published(self._republishing)
            self._republishing = None
            await self._heartbeat(self.agent.config.heartbeat_interval_s)

    async def _guarded(self, work: Awaitable[None]) -> None:
        try:
            await work
        except Exception as exc:  # the registry is advisory: log, resync later
            log.warning("registry publish failed: %s", exc)


def machine_facts(agent: Agent, machine: Machine) -> MachineFacts:
    return MachineFacts(
        id=machine.id, app=machine.spec.app, worker=agent.worker_id, region=agent.config.region,
        state=machine.state.value, image_digest=machine.image_digest,
        created_at=machine.created_at, updated_at=machine.updated_at,
        address=agent.address(machine), app_uid=machine.spec.app_uid,
        release=machine.spec.release,
    )


def machine_view(agent: Agent, machine: Machine) -> MachineView:
    facts = machine_facts(agent, machine)
    return MachineView(
        **facts_of(facts), image=machine.spec.image,
        pid=machine.process.pid if machine.process else 0, guest=machine.spec.guest,
        events=[EventView(e.state.value, e.event, e.at, e.reason) for e in machine.events],
        for_spares=machine.spec.for_spares,
        seal=tickets.seal(machine.spec.ticket, facts.state, facts.address, facts.updated_at)
        if machine.spec.ticket else "",
    )


def machine_record(agent: Agent, machine: Machine) -> MachineRecord:
    """The machine's registry record, sealed with its route ticket when it has one."""
    record = MachineRecord(
        **facts_of(machine_facts(agent, machine)), epoch=agent.state.epoch,
        events=[RegistryEvent(e.state.value, e.at, e.reason) for e in machine.events],
    )
    if not machine.spec.ticket:
        return record
    return msgspec.structs.replace(record, seal=tickets.seal_record(machine.spec.ticket, record))
