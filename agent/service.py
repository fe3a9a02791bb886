"""The agent shell: persists a record, applies it to the core state, then acts.

Every operation on a machine is (1) a legal transition checked by the core
table, (2) appended to the op log, (3) applied to the in-memory state at once
(so the next decision sees it), (4) carried out (pull, launch, signal) only once
the record is durable (`durable()`: appends share fsyncs). An append that cannot
be written changes nothing (`DiskFull`, 503) and the agent takes changes again as
soon as one can be. Long operations run as one task per machine; a stop or
destroy cancels a start in flight.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
import signal as signals
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from agent.config import AgentConfig
from agent.core.machine import MachineEvent, MachineState, next_state
from agent.core.offers import Accept, Capacity, Decline, decide_offer, decide_start
from agent.core.oplog_codec import CorruptLog
from agent.core.records import Boot, Created, Gone, ImageResolved, Launched, MachineSpec, Record
from agent.core.records import Transition as TransitionRecord
from agent.core.restart import GiveUp, after_crash
from agent.core.state import AgentState, Machine, replay, snapshot
from agent.driver import LaunchSpec, ProcessDriver, ProcessIdentity, allocate_port
from agent.errors import AgentError, Conflict, Declined, DiskFull, LogDamaged, NotFound, WaitTimeout
from agent.metrics import AgentMetrics
from agent.oplog import LogSyncFailed, LogWriteFailed, OpLog
from imagecache.api import Image
from imagecache.cache import ImageCache
from imagecache.errors import ImageError

log = logging.getLogger("thaw.agent")

S = MachineState
E = MachineEvent
IDLE = frozenset({S.CREATED, S.STOPPED, S.FAILED})  # machines whose image may go under pressure


def machine_id() -> str:
    return secrets.token_hex(7)


class Agent:
    """One worker host. `publish` is called with a machine id whenever it changes."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        cache: ImageCache,
        driver: ProcessDriver,
        worker_id: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.cache = cache
        self.driver = driver
        self.worker_id = worker_id
        self.clock = clock
        self.state = AgentState()
        self.oplog = OpLog(config.state_dir / "oplog")
        self.metrics = AgentMetrics()
        self.draining = False
        self.disk_full = False  # the last append could not be written (see disk_short)
        self.on_change: Callable[[str], None] = lambda machine_id: None
        self._ops: dict[str, asyncio.Task[None]] = {}
        self._changed = asyncio.Event()

    # -- persistence -----------------------------------------------------------

    def persist(self, record: Record) -> None:
        """Write the record, then apply it; what it describes is carried out once
        `durable()` returns. A record that cannot be written changes nothing (DiskFull)."""
        try:
            self.oplog.append(record)
        except LogWriteFailed as exc:
            self.disk_full = True
            self.metrics.log_failures.inc()
            raise DiskFull(f"the op log cannot be written ({exc.reason}); no change made "
                           "until it can") from None
        self.disk_full = False
        self.state.apply(record)
        if self.oplog.appended_since_compaction > self.config.compact_after_records:
            self.oplog.compact(snapshot(self.state))  # put off while an fsync runs
        self._changed.set()
        self._changed = asyncio.Event()
        mid = getattr(record, "id", None)
        if mid is not None:
            self.on_change(mid)

    def transition(self, machine: Machine, event: MachineEvent, reason: str = "") -> None:
        new = next_state(machine.state, event)
        self.persist(TransitionRecord(machine.id, event.value, new.value, self.clock(), reason))
        self.metrics.transitions.labels(event.value, new.value).inc()

    async def durable(self) -> None:
        """Return once every record written so far is on disk (effects wait for this)."""
        try:
            await self.oplog.durable()
        except LogSyncFailed as exc:
            raise AgentError(str(exc), code="disk_error", status=503) from None

    def disk_short(self) -> bool:
        """The last append failed and the state dir has no room yet (free space below
        `disk_reserve_bytes`); the flag clears itself when room returns."""
        if self.disk_full and shutil.disk_usage(self.config.state_dir).free >= \
                self.config.disk_reserve_bytes:
            self.disk_full = False
        return self.disk_full

    def boot(self, repair: bool = False) -> int:
        """Replay the log, append a boot record; return the new epoch. A log damaged
        before its end stops the boot (LogDamaged) unless `repair` keeps its valid prefix."""
        try:
            records = self.oplog.open()
        except CorruptLog as exc:
            if not repair:
                raise LogDamaged(
                    f"op log {self.oplog.path} is damaged at byte {exc.offset} ({exc.reason}); "
                    f"`thaw agent --repair` keeps a copy of it and starts from the "
                    f"{len(exc.records)} records before that byte") from None
            records = self.oplog.repair(exc)
        self.state = replay(records)
        if self.oplog.dropped_torn_tail:
            log.warning("op log: dropped a torn or zero-filled tail")
        self.persist(Boot(epoch=self.state.epoch + 1, at=self.clock()))
        if not self.oplog.compact(snapshot(self.state)) and self.oplog.migrated:
            raise LogDamaged(f"op log {self.oplog.path} is in format 1 and could not be "
                             "rewritten in format 2 (no space?)")
        return self.state.epoch

    # -- lookups ---------------------------------------------------------------

    def machine(self, mid: str) -> Machine:
        machine = self.state.machines.get(mid)
        if machine is None:
            raise NotFound(f"machine {mid} not found")
        return machine

    def capacity(self) -> Capacity:
        return Capacity(self.config.cpus, self.config.memory_mb)

    def address(self, machine: Machine) -> str:
        if machine.state is S.STARTED and machine.process is not None:
            return f"{self.config.machine_host}:{machine.process.port}"
        return ""

    # -- operations (API) -------------------------------------------------------

    def offer(self, key: str, spec: MachineSpec, start: bool, spare: bool = False) -> Machine:
        """A new machine (started at once when `start`). One offered to be started soon
        needs room now; a `spare` (a standby) does not."""
        decision = decide_offer(self.state, self.capacity(), key, spec, machine_id(),
                                self.draining, needs_room=start or not spare)
        if isinstance(decision, Decline):
            self.metrics.offers.labels(decision.reason).inc()
            raise Declined(decision.message, code=decision.reason)
        assert isinstance(decision, Accept)
        if decision.existing:
            self.metrics.offers.labels("repeated").inc()
            return self.machine(decision.machine_id)
        self.metrics.offers.labels("accepted").inc()
        self.persist(Created(decision.machine_id, spec, key, self.clock()))
        machine = self.machine(decision.machine_id)
        if start:
            self.start(machine.id)
        return machine

    def start(self, mid: str) -> Machine:
        machine = self.machine(mid)
        next_state(machine.state, E.START)  # 409 for an illegal start before room is judged
        refused = decide_start(self.state, self.capacity(), machine)
        if refused is not None:
            self.metrics.offers.labels("start_declined").inc()
            raise Declined(refused.message, code=refused.reason)
        self.transition(machine, E.START)
        self.run_op(mid, self.start_task(mid))
        return machine

    def stop(self, mid: str) -> Machine:
        machine = self.machine(mid)
        next_state(machine.state, E.STOP)  # 409 before cancelling anything
        self._cancel(mid)
        self.transition(machine, E.STOP)
        self.run_op(mid, self.stop_task(mid))
        return machine

    async def suspend(self, mid: str) -> Machine:
        machine = self.machine(mid)
        self.transition(machine, E.SUSPEND)
        await self.durable()
        if machine.state is not S.SUSPENDING:  # something else came first while it synced
            return machine
        if machine.process is not None and self.driver.suspend(ident(machine)):
            self.transition(machine, E.SUSPENDED)
        else:
            self.crashed(machine)
        return machine

    def destroy(self, mid: str) -> Machine:
        machine = self.machine(mid)
        next_state(machine.state, E.DESTROY)
        self._cancel(mid)
        self.transition(machine, E.DESTROY)
        self.run_op(mid, self.destroy_task(mid))
        return machine

    async def wait(self, mid: str, target: MachineState, timeout_s: float) -> Machine | None:
        """Return when the machine is in `target` (None: destroyed, as asked); 409 if it
        fails or vanishes first; 408 after `timeout_s`."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            machine = self.state.machines.get(mid)
            if machine is None:
                if target is S.DESTROYED:
                    return None
                raise Conflict(f"machine {mid} was destroyed", code="destroyed")
            if machine.state is target:
                return machine
            if machine.state is S.FAILED and target is not S.FAILED:
                reason = machine.events[-1].reason if machine.events else ""
                raise Conflict(f"machine {mid} failed: {reason}", code="machine_failed")
            changed = self._changed
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise_timeout(mid, target, machine.state)
            try:
                async with asyncio.timeout(remaining):
                    await changed.wait()
            except TimeoutError:
                raise_timeout(mid, target, machine.state)

    async def pull(self, ref: str) -> Image:
        """Pull `ref`. Under disk pressure (the cache refuses it for room), the images of
        stopped machines are let go, oldest first, until it fits: such a machine keeps
        existing, and its image is pulled again when it starts."""
        self.metrics.pulls.inc()
        idle = sorted((m for m in self.state.machines.values() if m.state in IDLE),
                      key=lambda m: m.updated_at)
        while True:
            try:
                return await self.cache.pull(ref)
            except ImageError as exc:
                if exc.code != "no_space" or not idle:
                    raise
            released = idle.pop(0)
            log.info("disk pressure: the image of stopped machine %s may be evicted",
                     released.id)
            self.cache.unpin(released.id)

    # -- tasks -----------------------------------------------------------------

    def run_op(self, mid: str, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work, name=f"machine-{mid}")
        self._ops[mid] = task
        task.add_done_callback(lambda t: self._op_done(mid, t))

    def _op_done(self, mid: str, task: asyncio.Task[None]) -> None:
        if self._ops.get(mid) is task:
            del self._ops[mid]
        if not task.cancelled() and task.exception() is not None:
            log.error("machine %s: operation failed", mid, exc_info=task.exception())

    def _cancel(self, mid: str) -> None:
        task = self._ops.pop(mid, None)
        if task is not None:
            task.cancel()

    def busy(self, mid: str) -> bool:
        return mid in self._ops

    async def start_task(self, mid: str, delay_s: float = 0.0) -> None:
        await self.durable()  # the start is on disk before anything runs
        if delay_s:
            await asyncio.sleep(delay_s)
        machine = self.machine(mid)
        began = time.monotonic()
        if machine.process is None or not self.driver.alive(ident(machine)):
            if machine.process is not None:
                self.persist(Gone(mid, self.clock()))
            try:
                image = await self._image_for(machine)
                self._launch(machine, image)
            except ImageError as exc:
                self.transition(machine, E.FAIL, f"image {machine.spec.image}: {exc}")
                return
            except OSError as exc:
                self.transition(machine, E.FAIL, f"launch: {exc}")
                return
        elif self.driver.resume(ident(machine)):
            # A thawed process was ready when frozen and its listening socket never
            # closed (connects wait in the backlog): it is ready again now, no probe.
            self.transition(machine, E.READY, "resumed")
            self.metrics.ready_seconds.observe(time.monotonic() - began)
            return
        await self._await_ready(machine, began)

    async def _image_for(self, machine: Machine) -> Image:
        image = self.cache.image(machine.image_digest) if machine.image_digest else None
        if image is None:
            image = await self.pull(machine.spec.image)
        if image.digest != machine.image_digest:
            self.persist(ImageResolved(machine.id, image.digest, self.clock()))
        self.cache.pin(machine.id, image.digest)
        return image

    def _launch(self, machine: Machine, image: Image) -> None:
        port = allocate_port(self.config.machine_host)
        spec = launch_spec(machine, image, port, self.config.state_dir)
        launched = self.driver.launch(spec)
        try:
            self.persist(Launched(machine.id, launched.pid, launched.start_time, port,
                                 self.clock()))
        except DiskFull:
            self.driver.kill_now(launched)  # a process the log does not know must not run
            raise
        self.metrics.launches.inc()

    async def _await_ready(self, machine: Machine, began: float) -> None:
        assert machine.process is not None
        health = machine.spec.health
        result = await self.driver.wait_ready(
            ident(machine),
            self.config.machine_host,
            machine.process.port,
            health.path or None,
            health.timeout_s,
        )
        if result.ready:
            self.transition(machine, E.READY)
            self.metrics.ready_seconds.observe(time.monotonic() - began)
        elif result.reason == "exited":
            self.crashed(machine)
        else:
            await self.kill(machine)
            self.transition(machine, E.FAIL, f"not ready after {health.timeout_s:g}s")

    def crashed(self, machine: Machine) -> None:
        """The process died unasked: restart with backoff, or fail after a crash loop."""
        self.metrics.crashes.inc()
        if machine.process is not None:
            self.persist(Gone(machine.id, self.clock()))
        decision = after_crash(self.config.restart, machine.crashes, self.clock())
        if isinstance(decision, GiveUp):
            self.transition(machine, E.FAIL, decision.reason)
            return
        self.transition(machine, E.CRASH, "process exited")
        self.run_op(machine.id, self.start_task(machine.id, decision.delay_s))

    async def kill(self, machine: Machine) -> None:
        if machine.process is None:
            return
        sig = signals.Signals[machine.spec.kill_signal]
        await self.driver.stop(ident(machine), sig, machine.spec.kill_timeout_s)
        self.persist(Gone(machine.id, self.clock()))

    async def stop_task(self, mid: str) -> None:
        await self.durable()
        machine = self.machine(mid)
        await self.kill(machine)
        self.transition(machine, E.EXITED)

    async def destroy_task(self, mid: str) -> None:
        await self.durable()
        machine = self.machine(mid)
        await self.kill(machine)
        self.cache.unpin(mid)
        self.transition(machine, E.DESTROYED)
        shutil.rmtree(machine_dir(self.config.state_dir, mid), ignore_errors=True)
        self.on_change(mid)

    async def close(self) -> None:
        for mid in list(self._ops):
            self._cancel(mid)
        if self.config.stop_machines_on_exit:
            await asyncio.gather(
                *(self.kill(m) for m in list(self.state.machines.values())),
                return_exceptions=True,
            )
        self.oplog.close()


def raise_timeout(mid: str, target: MachineState, current: MachineState) -> None:
    raise WaitTimeout(f"machine {mid} is {current.value}, not {target.value}, after the timeout")


def ident(machine: Machine) -> ProcessIdentity:
    assert machine.process is not None
    return ProcessIdentity(machine.process.pid, machine.process.start_time)


def machine_dir(state_dir: Path, mid: str) -> Path:
    return state_dir / "machines" / mid


def launch_spec(machine: Machine, image: Image, port: int, state_dir: Path) -> LaunchSpec:
    env = dict(kv.split("=", 1) for kv in image.config.env if "=" in kv)
    env.update(machine.spec.env)
    env.update(PORT=str(port), THAW_APP=machine.spec.app, THAW_MACHINE_ID=machine.id)
    argv = [*image.config.entrypoint, *image.config.cmd]
    directory = machine_dir(state_dir, machine.id)
    directory.mkdir(parents=True, exist_ok=True)
    return LaunchSpec(
        machine_id=machine.id,
        argv=argv,
        env=env,
        rootfs=Path(image.rootfs),
        workdir=image.config.working_dir,
        log_path=directory / "log",
    )
