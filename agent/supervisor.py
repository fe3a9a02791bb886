"""Recovery after a restart of the agent, and the watch over running machines.

Recovery first kills every machine process of this agent's that the op log does
not record — a machine the log does not know (a truncated or repaired log), or a
second process for one it does — so no machine id ever has two process groups.
It then re-adopts machine processes that are still alive (pid + start time),
finishes operations the previous agent left half-done, restarts machines that
should run and do not, and stops strays. The watch notices unasked exits.
"""

from __future__ import annotations

import asyncio
import logging

from agent.core.machine import MachineEvent, MachineState
from agent.core.records import Gone
from agent.core.state import Machine
from agent.errors import AgentError
from agent.launch import machine_dir
from agent.service import Agent

log = logging.getLogger("thaw.agent")

S = MachineState


async def recover(agent: Agent) -> None:
    """Bring the world in line with the replayed state (call once, after `boot`)."""
    await kill_unrecorded(agent)
    for machine in list(agent.state.machines.values()):
        directory = machine_dir(agent.config.state_dir, machine.id)
        if (directory / "output").exists():  # its output goes on being stamped and kept
            agent.outputs.ensure(machine.id, directory)
        if machine.image_digest and agent.cache.image(machine.image_digest) is not None:
            agent.cache.pin(machine.id, machine.image_digest)
        if agent.busy(machine.id):  # asked for already (the API serves during recovery)
            continue
        try:
            alive = machine.process is not None and agent.driver.alive(agent.run_of(machine))
            if machine.process is not None and not alive:
                how = agent.driver.exit_reason(agent.run_of(machine))
                agent.journal.write(Gone(machine.id, agent.clock(), how))
            await _resume(agent, machine, alive)
        except AgentError as exc:  # no room to write it: the watch notices an exit again
            log.warning("machine %s: not recovered yet: %s", machine.id, exc.message)


async def kill_unrecorded(agent: Agent) -> None:
    """End each machine run of this agent's that its op log does not record."""
    recorded = {mid: agent.run_of(m) if m.process is not None else None
                for mid, m in agent.state.machines.items()}
    await agent.driver.adopt(agent.config.state_dir / "machines", recorded)


async def _resume(agent: Agent, machine: Machine, alive: bool) -> None:
    mid = machine.id
    match machine.state:
        case S.STARTED:
            if not alive:
                agent.crashed(machine)
        case S.STARTING:
            agent.run_op(mid, agent.start_task(mid))
        case S.SUSPENDING | S.SUSPENDED:
            if alive and await agent.driver.suspend(agent.run_of(machine)):
                if machine.state is S.SUSPENDING:
                    agent.transition(machine, MachineEvent.SUSPENDED)
            elif machine.state is S.SUSPENDING:
                agent.crashed(machine)
        case S.STOPPING:
            agent.run_op(mid, agent.stop_task(mid))
        case S.DESTROYING:
            agent.run_op(mid, agent.destroy_task(mid))
        case S.CREATED | S.STOPPED if not alive:
            agent.run_op(mid, agent.prepare_task(mid))  # ready for its next start
        case _:
            if alive:
                agent.run_op(mid, agent.kill(machine))


async def watch(agent: Agent) -> None:
    """Notice machines whose process died unasked. What cannot be written now (a full
    disk) is noticed again on the next tick."""
    unwritten: set[str] = set()  # machines whose exit is waiting for room (said once)
    while True:
        await asyncio.sleep(agent.config.supervise_interval_s)
        for machine in list(agent.state.machines.values()):
            pid = machine.process.pid if machine.process is not None else 0
            try:
                if _died(agent, machine):
                    agent.crashed(machine)
                    log.warning("machine %s: process %d exited unasked", machine.id, pid)
            except AgentError as exc:  # DiskFull, LogBroken: nothing was written
                if machine.id not in unwritten:
                    log.warning("machine %s: its process exited; cannot write that yet: %s",
                                machine.id, exc.message)
                    unwritten.add(machine.id)
                continue
            except Exception:  # a bug must not end the watch over every other machine
                log.exception("machine %s: watch failed", machine.id)
                continue
            unwritten.discard(machine.id)
        unwritten &= agent.state.machines.keys()


def _died(agent: Agent, machine: Machine) -> bool:
    if agent.busy(machine.id) or machine.state not in (S.STARTED, S.SUSPENDED):
        return False
    if machine.process is None:
        # Started without a process: its exit was written, the crash not (no room then).
        return machine.state is S.STARTED
    run = agent.run_of(machine)
    if agent.driver.alive(run):
        return False
    if machine.state is S.SUSPENDED:
        # A frozen machine that died lost its memory: the next start boots it afresh.
        agent.journal.write(Gone(machine.id, agent.clock(), agent.driver.exit_reason(run)))
        agent.run_op(machine.id, agent.after_exit(machine.id))
        return False
    return True
