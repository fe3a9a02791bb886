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
import secrets

from agent.core import offers
from agent.core.machine import MachineEvent, MachineState, next_state
from agent.core.offers import Accept, Capacity, Decline
from agent.core.records import Fenced, MachineSpec
from agent.core.state import Machine, stale_fence
from agent.errors import Conflict, Declined, DiskFull, LogBroken, WaitTimeout
from agent.machinetasks import MachineTasks
from ground.serving import ShuttingDown

S = MachineState
E = MachineEvent


def machine_id() -> str:
    return secrets.token_hex(7)


class Agent(MachineTasks):
    """One worker host: the operations its API is asked for (the long ones run as
    `MachineTasks`)."""

    def disk_short(self) -> bool:
        return self.journal.disk_short()

    def _log_takes_changes(self) -> None:
        """Refuse a start or stop while the op log is known to have no room (503): its
        first record might still fit the log's last page, but what must follow it (the
        exit, the state reached) would wait for room, and the machine with it, half-way
        (a stop left it `stopping` until room returned; a start then got 409)."""
        if self.journal.oplog.broken:
            raise LogBroken(self.journal.oplog.broken)
        if self.disk_short():
            raise DiskFull("the op log cannot be written now (disk full); no change made "
                           "until it can")

    def boot(self, repair: bool = False) -> int:
        """Replay the op log and write a boot record; the new epoch (see Journal.boot)."""
        return self.journal.boot(self.clock(), repair)

    def capacity(self) -> Capacity:
        return Capacity(self.config.cpus, self.config.memory_mb)

    def address(self, machine: Machine) -> str:
        """Where the edge dials the machine: said while it runs, and while it is suspended
        (its frozen app's socket still listens: an edge thawing it connects meanwhile)."""
        if machine.state in (S.STARTED, S.SUSPENDED) and machine.process is not None:
            return f"{machine.process.host or self.config.machine_host}:{machine.process.port}"
        return ""

    # -- operations (API) -------------------------------------------------------

    def offer(self, key: str, spec: MachineSpec, start: bool, spare: bool = False,
              wanted_id: str = "") -> Machine:
        """A new machine (started at once when `start`), named `wanted_id` when given (its
        route ticket is for that id). One offered to be started soon needs room now; a
        `spare` (a standby) does not."""
        decision = offers.decide_offer(self.state, self.capacity(), key, spec,
                                       wanted_id or machine_id(), self.draining,
                                       needs_room=start or not spare)
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
        self._log_takes_changes()
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
        self._log_takes_changes()
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

    async def wait(self, mid: str, target: MachineState, timeout_s: float,
                   durable: bool = True) -> Machine | None:
        """Return when the machine is in `target` and (`durable`) that is on disk (None:
        destroyed, as asked); 409 if it fails or vanishes first; 408 after `timeout_s`."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                return await self._reached(mid, target, durable)
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

    async def _reached(self, mid: str, target: MachineState,
                       durable: bool = True) -> Machine | None:
        while True:
            machine = self.state.machines.get(mid)
            if machine is None:
                if target is S.DESTROYED:
                    await self.durable()
                    return None
                raise Conflict(f"machine {mid} was destroyed", code="destroyed")
            if machine.state is target:
                if durable:
                    await self.durable()
                return machine
            if machine.state is S.FAILED and target is not S.FAILED:
                reason = machine.events[-1].reason if machine.events else ""
                raise Conflict(f"machine {mid} failed: {reason}", code="machine_failed")
            if self.stopping:
                raise ShuttingDown(f"the agent is stopping; machine {mid} is "
                                   f"{machine.state.value}, not {target.value}")
            await self._changed.wait()

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
