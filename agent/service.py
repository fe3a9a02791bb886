"""The agent shell: writes a record, applies it to the core state, then acts.

Every operation on a machine is (1) a legal transition checked by the core
table, (2) written to the op log and applied to the in-memory state at once (so
the next decision sees it; `agent.journal`), (3) carried out (pull, launch,
signal) only once the record is durable (`durable()`: writes share fsyncs). A
change that cannot be written changes nothing (503) and the agent takes changes
again as soon as one can be; what already happened is written eventually. Long
operations run as one task per machine; a stop or destroy, once written,
cancels a start in flight.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import signal as signals
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from agent.config import AgentConfig
from agent.core import offers
from agent.core.machine import MachineEvent, MachineState, next_state
from agent.core.offers import Accept, Capacity, Decline
from agent.core.records import Fenced, Gone, ImageResolved, Launched, MachineSpec, Record
from agent.core.records import Transition as TransitionRecord
from agent.core.restart import GiveUp, after_crash
from agent.core.runplan import NothingToRun, stop_signal
from agent.core.state import AgentState, Machine, stale_fence, transition_record
from agent.driverport import Driver, LaunchSpec, Running
from agent.errors import AgentError, Conflict, Declined, NotFound, WaitTimeout
from agent.journal import Journal, record_ids
from agent.launch import launch_spec, machine_dir, running
from agent.machinelog import read_log
from agent.metrics import AgentMetrics
from agent.outputs import Outputs
from imagecache.adapters.trees import remove_tree_quietly
from imagecache.api import Image, ImageConfig
from imagecache.cache import ImageCache
from imagecache.errors import ImageError

log = logging.getLogger("thaw.agent")

S = MachineState
E = MachineEvent
IDLE = frozenset({S.CREATED, S.STOPPED, S.FAILED})  # machines whose image may go under pressure
OUTPUT_KEPT_BYTES = 4096  # of a machine's last output, kept with the reason it failed


def machine_id() -> str:
    return secrets.token_hex(7)


class Agent:
    """One worker host. `on_change` is called with a machine id whenever it changes."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        cache: ImageCache,
        driver: Driver,
        worker_id: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.cache = cache
        self.driver = driver
        self.worker_id = worker_id
        self.clock = clock
        self.metrics = AgentMetrics()
        self.journal = Journal(config.state_dir,
                               compact_after_records=config.compact_after_records,
                               disk_reserve_bytes=config.disk_reserve_bytes,
                               on_refused=self.metrics.log_failures.inc,
                               on_written=self._written)
        self.draining = False
        self.on_change: Callable[[str], None] = lambda machine_id: None
        self._ops: dict[str, asyncio.Task[object]] = {}
        self._changed = asyncio.Event()
        self.outputs = Outputs(config.log_max_bytes, config.log_rate_bytes_s)

    @property
    def state(self) -> AgentState:
        return self.journal.state

    def _written(self, records: tuple[Record, ...]) -> None:
        for record in records:
            if isinstance(record, TransitionRecord):
                self.metrics.transitions.labels(record.event, record.state).inc()
            elif isinstance(record, Gone) and record.reason:
                self.metrics.exits.labels(record.reason.split("(")[0]).inc()
        self._changed.set()
        self._changed = asyncio.Event()
        for mid in record_ids(records):
            self.on_change(mid)

    def transition(self, machine: Machine, event: MachineEvent, reason: str = "") -> None:
        self.journal.write(transition_record(machine, event, self.clock(), reason))

    async def durable(self) -> None:
        await self.journal.durable()

    def disk_short(self) -> bool:
        return self.journal.disk_short()

    def boot(self, repair: bool = False) -> int:
        """Replay the op log and write a boot record; the new epoch (see Journal.boot)."""
        return self.journal.boot(self.clock(), repair)

    def machine(self, mid: str) -> Machine:
        machine = self.state.machines.get(mid)
        if machine is None:
            raise NotFound(f"machine {mid} not found")
        return machine

    def capacity(self) -> Capacity:
        return Capacity(self.config.cpus, self.config.memory_mb)

    def address(self, machine: Machine) -> str:
        if machine.state is S.STARTED and machine.process is not None:
            return f"{machine.process.host or self.config.machine_host}:{machine.process.port}"
        return ""

    def run_of(self, machine: Machine) -> Running:
        """The machine's recorded run (it has a process)."""
        return running(machine, self.config.machine_host)

    def directory(self, mid: str) -> Path:
        return machine_dir(self.config.state_dir, mid)

    # -- operations (API) -------------------------------------------------------

    def offer(self, key: str, spec: MachineSpec, start: bool, spare: bool = False) -> Machine:
        """A new machine (started at once when `start`). One offered to be started soon
        needs room now; a `spare` (a standby) does not."""
        decision = offers.decide_offer(self.state, self.capacity(), key, spec, machine_id(),
                                self.draining, needs_room=start or not spare)
        if isinstance(decision, Decline):
            self.metrics.offers.labels(decision.reason).inc()
            raise Declined(decision.message, code=decision.reason)
        assert isinstance(decision, Accept)
        if decision.existing:
            self.metrics.offers.labels("repeated").inc()
            return self.machine(decision.machine_id)
        mid = decision.machine_id
        self.journal.write(*offers.accepted_records(mid, spec, key, self.clock(), start))
        self.metrics.offers.labels("accepted").inc()
        if start:
            self.run_op(mid, self.start_task(mid))
        else:
            self.run_op(mid, self.prepare_task(mid))
        return self.machine(mid)

    def fence(self, app: str, token: int | None) -> None:
        """A call on `app`'s machines under fencing `token` (its caller's reconcile lease;
        None: none claimed): refused (409 `stale_fence`) when a newer token was seen, a
        newer one written down before the call acts (it outlives a restart)."""
        why = stale_fence(self.state, app, token)
        if why:
            self.metrics.offers.labels("stale_fence").inc()
            raise Conflict(why, code="stale_fence")
        if token is not None and token > self.state.fences.get(app, 0):
            self.journal.write(Fenced(app, token, self.clock()))

    def start(self, mid: str) -> Machine:
        machine = self.machine(mid)
        next_state(machine.state, E.START)  # 409 for an illegal start before room is judged
        refused = offers.decide_start(self.state, self.capacity(), machine)
        if refused is not None:
            self.metrics.offers.labels("start_declined").inc()
            raise Declined(refused.message, code=refused.reason)
        self.transition(machine, E.START)
        self.run_op(mid, self.start_task(mid))
        return machine

    def stop(self, mid: str) -> Machine:
        machine = self.machine(mid)
        self.transition(machine, E.STOP)  # written first: a refused stop cancels nothing
        self.run_op(mid, self.stop_task(mid))  # cancels a start in flight
        return machine

    async def suspend(self, mid: str) -> Machine:
        """Freeze a started machine; returns once that is written (or it crashed)."""
        machine = self.machine(mid)
        self.transition(machine, E.SUSPEND)
        task = self.run_op(mid, self.suspend_task(mid))
        await asyncio.wait([task])  # not cancelled with this call: the task goes on
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise error
        await self.durable()
        return machine

    def destroy(self, mid: str) -> Machine:
        machine = self.machine(mid)
        self.transition(machine, E.DESTROY)
        self.run_op(mid, self.destroy_task(mid))
        return machine

    async def wait(self, mid: str, target: MachineState, timeout_s: float) -> Machine | None:
        """Return when the machine is in `target` and that is durable (None: destroyed, as
        asked); 409 if it fails or vanishes first; 408 after `timeout_s`."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                return await self._reached(mid, target)
        except TimeoutError:
            machine = self.state.machines.get(mid)
            current = machine.state.value if machine is not None else "gone"
            raise WaitTimeout(f"machine {mid} is {current}, not {target.value}, after "
                              f"the timeout{self._crashing(machine)}") from None

    def _crashing(self, machine: Machine | None) -> str:
        """For a machine that is restarting after a crash: how it last ended, and its last
        output (what its owner needs to see why it never gets ready)."""
        if machine is None or not machine.events or machine.events[-1].event != "crash":
            return ""
        return "; " + self._with_output(machine.id, f"it crashed ({machine.events[-1].reason})")

    async def _reached(self, mid: str, target: MachineState) -> Machine | None:
        while True:
            machine = self.state.machines.get(mid)
            if machine is None:
                if target is S.DESTROYED:
                    await self.durable()
                    return None
                raise Conflict(f"machine {mid} was destroyed", code="destroyed")
            if machine.state is target:
                await self.durable()
                return machine
            if machine.state is S.FAILED and target is not S.FAILED:
                reason = machine.events[-1].reason if machine.events else ""
                raise Conflict(f"machine {mid} failed: {reason}", code="machine_failed")
            await self._changed.wait()

    async def pull(self, ref: str) -> Image:
        """Pull `ref`. Under disk pressure (the cache refuses it for room), the images of
        idle machines are let go, oldest first, until it fits: such a machine keeps
        existing, and its image is pulled again when it starts."""
        self.metrics.pulls.inc()
        released: set[str] = set()
        while True:
            try:
                return await self.cache.pull(ref)
            except ImageError as exc:
                idle = [m for m in self.state.machines.values()
                        if m.state in IDLE and m.id not in released]  # as they are now
                if exc.code != "no_space" or not idle:
                    raise
            oldest = min(idle, key=lambda m: m.updated_at)
            log.info("disk pressure: the image of idle machine %s may be evicted", oldest.id)
            released.add(oldest.id)
            self.cache.unpin(oldest.id)

    # -- tasks -----------------------------------------------------------------

    def run_op(self, mid: str, work: Coroutine[Any, Any, object]) -> asyncio.Task[object]:
        """Run `work` as the machine's one operation; one still running is cancelled
        (unless it is the caller, handing over: a crash restarting its machine)."""
        previous = self._ops.get(mid)
        if previous is not None and previous is not asyncio.current_task():
            previous.cancel()
        task = asyncio.create_task(work, name=f"machine-{mid}")
        self._ops[mid] = task
        task.add_done_callback(lambda t: self._op_done(mid, t))
        return task

    def _op_done(self, mid: str, task: asyncio.Task[object]) -> None:
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
        """Launch (or resume) the machine and wait until it is ready."""
        if delay_s:
            await asyncio.sleep(delay_s)
        await self.durable()  # the start is on disk before anything runs
        machine = self.machine(mid)
        began = time.monotonic()
        if machine.process is None or not self.driver.alive(self.run_of(machine)):
            failure = await self._launch(machine)
            if failure:
                await self.journal.eventually(lambda: self.transition(machine, E.FAIL, failure))
                return
        elif await self.driver.resume(self.run_of(machine)):
            # A thawed process was ready when frozen and its listening socket never
            # closed (connects wait in the backlog): it is ready again now, no probe.
            await self.journal.eventually(lambda: self.transition(machine, E.READY, "resumed"))
            self.metrics.ready_seconds.observe(time.monotonic() - began)
            return
        await self._await_ready(machine, began)

    async def _launch(self, machine: Machine) -> str:
        """Launch a new process for the machine: "" once its Launched record is written,
        else why not (its start fails with that reason)."""
        if machine.process is not None:
            await self.journal.eventually(lambda: self.journal.write(Gone(machine.id,
                                                                          self.clock())))
        if self.directory(machine.id).exists():  # it has run before
            await self.end_strays(machine.id)
        try:
            image = await self._image_for(machine)
            launched = await self.driver.launch(self._spec(machine, image))
        except ImageError as exc:
            return f"image {machine.spec.image}: {exc}"
        except NothingToRun as exc:
            return f"start_failed: {exc}"
        except OSError as exc:
            return self._with_output(machine.id, f"start_failed: {exc}")
        except Exception:  # a bug must not leave the machine starting for ever
            log.exception("machine %s: launch failed", machine.id)
            return "start_failed: internal error"
        try:
            self.journal.write(Launched(machine.id, launched.pid, launched.start_time,
                                        launched.port, self.clock(), launched.runtime_id,
                                        launched.host))
        except AgentError as exc:  # DiskFull, LogBroken: an unrecorded process must not run
            await self.driver.stop(launched, signals.SIGKILL, 0)
            return f"its process could not be recorded: {exc.message}"
        self.metrics.launches.inc()
        return ""

    def _spec(self, machine: Machine, image: Image) -> LaunchSpec:
        """What the driver is to run (NothingToRun if nothing), with its output pumped."""
        spec = launch_spec(machine, image, self.config.state_dir)
        self.outputs.ensure(machine.id, spec.machine_dir)
        return spec

    def _with_output(self, mid: str, reason: str) -> str:
        """`reason`, and the machine's last output (its own words on why it failed)."""
        tail = read_log(self.directory(mid) / "log", OUTPUT_KEPT_BYTES)
        text = tail.decode(errors="replace").strip()
        return f"{reason}; last output:\n{text}" if text else reason

    async def _image_for(self, machine: Machine) -> Image:
        image = self.cache.image(machine.image_digest) if machine.image_digest else None
        if image is None:
            image = await self.pull(machine.spec.image)
        if image.digest != machine.image_digest:
            resolved = ImageResolved(machine.id, image.digest, self.clock())
            await self.journal.eventually(lambda: self.journal.write(resolved))
        self.cache.pin(machine.id, image.digest)
        return image

    async def _await_ready(self, machine: Machine, began: float) -> None:
        assert machine.process is not None
        health = machine.spec.health
        result = await self.driver.wait_ready(self.run_of(machine), health.path or None,
                                              health.timeout_s)
        if result.ready:
            await self.journal.eventually(lambda: self.transition(machine, E.READY))
            self.metrics.ready_seconds.observe(time.monotonic() - began)
        elif result.reason == "exited":
            await self.journal.eventually(lambda: self.crashed(machine))
        else:
            await self.kill(machine)
            reason = self._with_output(machine.id, f"not ready after {health.timeout_s:g}s "
                                       f"(nothing answered on port {machine.spec.port or 'PORT'})")
            await self.journal.eventually(lambda: self.transition(machine, E.FAIL, reason))

    def crashed(self, machine: Machine) -> None:
        """The process died unasked: restart with backoff, or fail after a crash loop.
        Safe to call again after a DiskFull (what was written is not written twice)."""
        if machine.process is not None:
            how = self.driver.exit_reason(self.run_of(machine))
            self.journal.write(Gone(machine.id, self.clock(), how))
        how = machine.last_exit or "exited(?)"
        decision = after_crash(self.config.restart, machine.crashes, self.clock())
        if isinstance(decision, GiveUp):
            reason = self._with_output(machine.id, f"{decision.reason}; last: {how}")
            self.transition(machine, E.FAIL, reason)
            self.metrics.crashes.inc()
            self.run_op(machine.id, self.after_exit(machine.id))
            return
        self.transition(machine, E.CRASH, how)
        self.metrics.crashes.inc()
        self.run_op(machine.id, self.start_task(machine.id, decision.delay_s))

    async def kill(self, machine: Machine) -> str:
        """End the machine's process (its stop signal, then SIGKILL) and write that; then
        let go of what only its run held. How it ended ("" if it had no process)."""
        how = ""
        if machine.process is not None:
            run = self.run_of(machine)
            sig = signals.Signals[self.stop_signal(machine)]
            await self.driver.stop(run, sig, machine.spec.kill_timeout_s)
            how = self.driver.exit_reason(run)
            await self.journal.eventually(lambda: self.journal.write(Gone(machine.id,
                                                                          self.clock(), how)))
        await self.after_exit(machine.id)
        return how

    def stop_signal(self, machine: Machine) -> str:
        image = self.cache.image(machine.image_digest) if machine.image_digest else None
        return stop_signal(machine.spec.kill_signal, image.config if image else ImageConfig())

    async def after_exit(self, mid: str) -> None:
        """The machine's process is gone: end anything of it that outlived it, and let go
        of what only a run holds (its container, its cgroup)."""
        await self.end_strays(mid)
        await self.driver.exited(mid, self.directory(mid))

    async def end_strays(self, mid: str) -> None:
        await self.driver.end_strays(self.config.state_dir / "machines", mid)

    async def prepare_task(self, mid: str) -> None:
        """Make the machine ready to start (an OCI container created, its rootfs and network
        up): a spare's or a stopped machine's start is then the app's exec. Best effort: a
        failure here is tried again, and reported, by the start."""
        await self.durable()
        machine = self.machine(mid)
        try:
            image = await self._image_for(machine)
            await self.driver.prepare(self._spec(machine, image))
        except (ImageError, NothingToRun, OSError) as exc:
            log.info("machine %s: not prepared ahead: %s", mid, exc)

    async def suspend_task(self, mid: str) -> None:
        await self.durable()
        machine = self.machine(mid)
        if machine.process is not None and await self.driver.suspend(self.run_of(machine)):
            await self.journal.eventually(lambda: self.transition(machine, E.SUSPENDED))
        else:
            await self.journal.eventually(lambda: self.crashed(machine))

    async def stop_task(self, mid: str) -> None:
        await self.durable()
        machine = self.machine(mid)
        how = await self.kill(machine)
        await self.journal.eventually(lambda: self.transition(machine, E.EXITED, how))
        await self.prepare_task(mid)  # its next start is the app's exec

    async def destroy_task(self, mid: str) -> None:
        await self.durable()
        machine = self.machine(mid)
        await self.kill(machine)
        await self.driver.destroy(mid, self.directory(mid))
        self.outputs.close(mid)
        self.cache.unpin(mid)
        # Its dir goes before `destroyed` is written: destroyed means nothing of it is left
        # (an agent that dies in between destroys it again at its start).
        await asyncio.to_thread(remove_tree_quietly, self.directory(mid))
        await self.journal.eventually(lambda: self.transition(machine, E.DESTROYED))
        self.on_change(mid)

    async def close(self) -> None:
        self.journal.closing = True  # facts waiting for room give up: the next boot sees
        for mid in list(self._ops):
            self._cancel(mid)
        if self.config.stop_machines_on_exit:
            await asyncio.gather(
                *(self.kill(m) for m in list(self.state.machines.values())),
                return_exceptions=True,
            )
            await self.driver.release_all(self.config.state_dir / "machines")
        self.outputs.close_all()
        await self.journal.close()
