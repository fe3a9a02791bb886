"""The agent's state: a pure fold of op log records.

Decides nothing by itself: `apply` turns one record into the next state, and
replaying a log from empty gives exactly the state the agent had when it wrote
the last record. Invariants: a machine exists from its `created` record until
its `destroyed` transition; capacity follows what runs (`held`): cpus and memory
are held while a machine is starting, started or being suspended, and while a
stopping or destroying one still has its process; a suspended machine keeps its
memory while its frozen process lives and gives its cpus back; a created, stopped or
failed one holds nothing, so idle apps hold no capacity; the same offer key
always names the same machine. It must not know about files or processes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.core.machine import MachineEvent, MachineState, next_state
from agent.core.records import (
    Boot,
    Created,
    Fenced,
    Gone,
    ImageResolved,
    Launched,
    MachineSpec,
    Record,
    Transition,
)

EVENTS_KEPT = 20


@dataclass(frozen=True)
class ProcessRef:
    pid: int
    start_time: int
    port: int
    runtime_id: str = ""
    host: str = ""


@dataclass(frozen=True)
class StateChange:
    state: MachineState
    event: str
    at: float
    reason: str


@dataclass
class Machine:
    id: str
    spec: MachineSpec
    offer_key: str
    created_at: float
    state: MachineState = MachineState.CREATED
    updated_at: float = 0.0
    image_digest: str = ""
    process: ProcessRef | None = None
    events: list[StateChange] = field(default_factory=list)
    crashes: list[float] = field(default_factory=list)  # times of unasked exits (restart policy)
    last_exit: str = ""  # how its last process ended (Gone.reason), "" if not known
    # its process was launched after its last transition: a start that launched it (not
    # one that thaws a process a suspend froze), or an older process's adoption by a log
    fresh: bool = False


@dataclass
class AgentState:
    epoch: int = 0
    machines: dict[str, Machine] = field(default_factory=dict)
    offers: dict[str, str] = field(default_factory=dict)  # offer key -> machine id
    fences: dict[str, int] = field(default_factory=dict)  # app -> highest fencing token

    def apply(self, record: Record) -> None:
        """Fold one record in. A record about a machine that does not exist (any more)
        changes nothing: the writer refuses those (`unknown_machine`), older logs may hold
        one written after a destroy."""
        if unknown_machine(self, (record,)):
            return
        match record:
            case Boot(epoch=epoch):
                self.epoch = max(self.epoch, epoch)
            case Fenced(app=app, token=token):
                self.fences[app] = max(self.fences.get(app, 0), token)
            case Created():
                self._create(record)
            case Transition():
                self._transition(record)
            case ImageResolved(id=mid, digest=digest, at=at):
                machine = self.machines[mid]
                machine.image_digest = digest
                machine.updated_at = at
            case Launched(id=mid, pid=pid, start_time=start_time, port=port, at=at,
                          runtime_id=runtime_id, host=host):
                machine = self.machines[mid]
                machine.process = ProcessRef(pid, start_time, port, runtime_id, host)
                machine.fresh = True
                machine.updated_at = at
            case Gone(id=mid, at=at, reason=reason):
                machine = self.machines[mid]
                machine.process = None
                machine.fresh = False
                machine.last_exit = reason or machine.last_exit
                machine.updated_at = at

    def _create(self, record: Created) -> None:
        self.machines[record.id] = Machine(
            id=record.id,
            spec=record.spec,
            offer_key=record.offer_key,
            created_at=record.at,
            updated_at=record.at,
            events=[StateChange(MachineState.CREATED, "create", record.at, "")],
        )
        if record.offer_key:
            self.offers[record.offer_key] = record.id

    def _transition(self, record: Transition) -> None:
        machine = self.machines[record.id]
        state = MachineState(record.state)
        if record.event == "crash":
            machine.crashes.append(record.at)
        elif record.event in ("start", "stop"):
            machine.crashes.clear()  # asked for: a fresh crash budget
        machine.state = state
        machine.fresh = False
        machine.updated_at = record.at
        machine.events.append(StateChange(state, record.event, record.at, record.reason))
        del machine.events[:-EVENTS_KEPT]
        if state is MachineState.DESTROYED:
            del self.machines[record.id]
            self.offers.pop(machine.offer_key, None)

    def reserved(self) -> tuple[float, int]:
        """(cpus, memory_mb) held by the machines, by what each runs (see `held`)."""
        cpus = memory = 0.0
        for machine in self.machines.values():
            machine_cpus, machine_memory = held(machine)
            cpus += machine_cpus
            memory += machine_memory
        return cpus, int(memory)


def unknown_machine(state: AgentState, records: Iterable[Record]) -> str:
    """The id of the first machine the records are about that neither exists in `state`
    nor is created by an earlier one of them ("" if none)."""
    created: set[str] = set()
    for record in records:
        if isinstance(record, Created):
            created.add(record.id)
        elif not isinstance(record, Boot | Fenced) and record.id not in state.machines \
                and record.id not in created:
            return record.id
    return ""


RUNNING = frozenset({MachineState.STARTING, MachineState.STARTED, MachineState.SUSPENDING})
WINDING_DOWN = frozenset({MachineState.STOPPING, MachineState.DESTROYING})


def held(machine: Machine) -> tuple[float, int]:
    """(cpus, memory_mb) a machine holds of its worker in its state."""
    guest = machine.spec.guest
    if machine.state in RUNNING or (machine.state in WINDING_DOWN
                                    and machine.process is not None):
        return guest.cpus, guest.memory_mb
    if machine.state is MachineState.SUSPENDED and machine.process is not None:
        return 0.0, guest.memory_mb  # frozen: no cpu, all its memory
    return 0.0, 0


def transition_record(machine: Machine, event: MachineEvent, at: float,
                      reason: str = "") -> Transition:
    """The record of `event` on the machine; IllegalTransition if the table forbids it."""
    return Transition(machine.id, event.value, next_state(machine.state, event).value, at,
                      reason)


def replay(records: Iterable[Record]) -> AgentState:
    state = AgentState()
    for record in records:
        state.apply(record)
    return state


def stale_fence(state: AgentState, app: str, token: int | None) -> str:
    """Why a call on `app`'s machines under fencing `token` must be refused ("" if it may
    go on): a higher token was seen, so the lease it was taken under has passed to another
    placement (None: the call claims no lease, as a wake's, and is not fenced)."""
    if token is None:
        return ""
    highest = state.fences.get(app, 0)
    if token < highest:
        return (f"fencing token {token} of app {app} is older than {highest}: the "
                "reconcile lease it was taken under has passed to another placement")
    return ""


RESUMED = "resumed"  # the reason of a `ready` that thawed a frozen process (no probe)


def thawed(machine: Machine) -> bool:
    """Whether the machine is started by thawing the process a suspend froze (its last
    event a `ready` of a resume): nothing new runs, so its start need not be on disk
    before it is answered — its records are written to the log's file before the answer
    (an agent killed -9 finds them), and a host that loses them loses the process too."""
    events = machine.events
    return bool(events) and events[-1].event == "ready" and events[-1].reason == RESUMED


def thaws(machine: Machine) -> bool:
    """Whether the machine's start under way thaws a process a suspend froze (its state
    before its last start was `suspended`, and no process was launched since): that
    process was ready when frozen and needs no readiness probe. Any other start with a
    live process — found by recovery after the agent died while it waited for a process
    it had launched to listen, the frozen one having died — must probe it: that process
    was never ready."""
    events = machine.events
    return (len(events) >= 2 and events[-1].event == "start"
            and events[-2].state is MachineState.SUSPENDED and not machine.fresh)


def snapshot(state: AgentState) -> list[Record]:
    """Records that replay to `state` (for compaction): per machine, its creation,
    its last transition, its image and its process."""
    records: list[Record] = [Boot(epoch=state.epoch, at=0.0)]
    records += [Fenced(app, token, 0.0) for app, token in state.fences.items()]
    for machine in state.machines.values():
        records.append(Created(machine.id, machine.spec, machine.offer_key, machine.created_at))
        launched = None if machine.process is None else Launched(
            machine.id, machine.process.pid, machine.process.start_time, machine.process.port,
            machine.updated_at, machine.process.runtime_id, machine.process.host)
        if launched is not None and not machine.fresh:  # launched before its last change
            records.append(launched)
        for change in machine.events:
            if change.event == "create":
                continue
            records.append(
                Transition(machine.id, change.event, change.state.value, change.at, change.reason)
            )
        if machine.image_digest:
            records.append(ImageResolved(machine.id, machine.image_digest, machine.updated_at))
        if machine.process is None and machine.last_exit:
            records.append(Gone(machine.id, machine.updated_at, machine.last_exit))
        if launched is not None and machine.fresh:
            records.append(launched)
    return records
