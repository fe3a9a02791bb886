"""The agent's machines and the long operations on them: the base of `agent.service`.

Holds what every operation needs — the config, the image cache, the driver, the journal
(op log + state), the metrics, the machines' output pumps — and runs the operations that
take time (start, stop, suspend, destroy, a crash's restart, preparing a machine ahead)
as one task per machine: a new one cancels the one it replaces, and what happened is
written `eventually` (a full disk waits, it does not forget). The operations the API
asks for, and their checks, are `agent.service.Agent`'s.
"""

from __future__ import annotations

import asyncio
import logging
import signal as signals
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from agent.config import AgentConfig
from agent.core.machine import MachineEvent, MachineState
from agent.core.records import Gone, ImageResolved, Launched, Record
from agent.core.records import Transition as TransitionRecord
from agent.core.restart import GiveUp, after_crash
from agent.core.runplan import NothingToRun, stop_signal
from agent.core.state import RESUMED, AgentState, Machine, thaws, transition_record
from agent.driverport import Driver, LaunchSpec, Running
from agent.errors import AgentError, NotFound
from agent.journal import Journal, record_ids
from agent.launch import launch_spec, machine_dir, running
from agent.machinelog import read_log
from agent.metrics import AgentMetrics
from agent.outputs import Outputs
from ground.auth.sealing import Unsealable, unseal_env
from imagecache.adapters.trees import remove_tree_quietly
from imagecache.api import Image, ImageConfig
from imagecache.cache import ImageCache
from imagecache.errors import ImageError

log = logging.getLogger("thaw.agent")

S = MachineState
E = MachineEvent
IDLE = frozenset({S.CREATED, S.STOPPED, S.FAILED})  # machines whose image may go under pressure
OUTPUT_KEPT_BYTES = 4096  # of a machine's last output, kept with the reason it failed


class MachineTasks:
    """One worker's machines and their long operations (see the module's docstring).
    `on_change` is called with a machine id whenever it changes."""

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
        self.stopping = False  # the agent stops: waits end (ground/serving.py)
        self.on_change: Callable[[str], None] = lambda machine_id: None
        self._ops: dict[str, asyncio.Task[object]] = {}
        self._syncs: set[asyncio.Future[None]] = set()  # sync_soon's, under way
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
        self._wake_waiters()
        for mid in record_ids(records):
            self.on_change(mid)

    def end_waits(self) -> None:
        """The agent stops: every wait answers now (503 shutting_down), none holds the
        stop (ground/serving.py)."""
        self.stopping = True
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def transition(self, machine: Machine, event: MachineEvent, reason: str = "") -> None:
        self.journal.write(transition_record(machine, event, self.clock(), reason))

    async def durable(self) -> None:
        await self.journal.durable()

    def sync_soon(self) -> None:
        """What is written so far reaches the disk with no caller waiting for it."""
        task = asyncio.ensure_future(self.journal.durable())
        self._syncs.add(task)
        task.add_done_callback(self._synced)

    def _synced(self, task: asyncio.Future[None]) -> None:
        self._syncs.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("op log sync failed: %s", task.exception())

    def machine(self, mid: str) -> Machine:
        machine = self.state.machines.get(mid)
        if machine is None:
            raise NotFound(f"machine {mid} not found")
        return machine

    def run_of(self, machine: Machine) -> Running:
        """The machine's recorded run (it has a process)."""
        return running(machine, self.config.machine_host)

    def directory(self, mid: str) -> Path:
        return machine_dir(self.config.state_dir, mid)

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
        """Launch (or resume) the machine and wait until it is ready. A launch waits for
        the start to be on disk before anything runs; a resume does not, nor does its
        answer (`start?wait_s`, `thawed`): nothing new runs, and the records are in the
        log's file before the thaw — an agent killed finds them at recovery (starting:
        the start is finished; started: adopted); a host that loses its page cache loses
        the process too. A live process is taken as ready without a probe only when this
        start is a resume (`thaws`); one launched and never seen ready (an agent that died
        during its probe) is probed."""
        if delay_s:
            await asyncio.sleep(delay_s)
        machine = self.machine(mid)
        began = time.monotonic()
        if machine.process is None or not self.driver.alive(self.run_of(machine)):
            await self.durable()  # the start is on disk before anything runs
            machine = self.machine(mid)
            failure = await self._launch(machine)
            if failure:
                await self.journal.eventually(lambda: self.transition(machine, E.FAIL, failure))
                return
        elif thaws(machine) and await self.driver.resume(self.run_of(machine)):
            # A thawed process was ready when frozen and its listening socket never
            # closed (connects wait in the backlog): it is ready again now, no probe.
            await self.journal.eventually(lambda: self.transition(machine, E.READY, RESUMED))
            self.metrics.ready_seconds.observe(time.monotonic() - began)
            return
        await self._await_ready(machine, began)  # (a live process never ready: probed)

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
        except (NothingToRun, Unsealable) as exc:
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
        assert self.config.cluster_keys is not None  # checked by the config
        secrets = unseal_env(self.config.cluster_keys, machine.spec.app, machine.spec.app_uid,
                             machine.spec.release, machine.spec.sealed_env)
        spec = launch_spec(machine, image, self.config.state_dir, secrets)
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
                                              health.timeout_s, h2c=health.protocol == "h2c")
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
        except (ImageError, NothingToRun, Unsealable, OSError) as exc:
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

