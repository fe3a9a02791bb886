"""Wake and autostop plans: which machines of an app to start, or whether one may stop.

Decides, from the app's config and its machines (as the agents report them),
which stopped machines to start again and how many new ones to place, and
whether an idle machine may be stopped. Invariants: a wake never makes the
app's machines exceed `max_machines` (machines that exist count, whatever their
state, except on workers that are gone); suspended machines are preferred to
stopped ones and those to never-started spares, because resuming is fastest;
an autostop never leaves fewer than `min_machines_running` started machines.
It must not know about HTTP, agents or time.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ground.appconfig import AppConfig, release_of
from ground.registry.types import MachineFacts

ACTIVE = frozenset({"starting", "started"})
# Best first: a machine already starting (an earlier wake ran out of time, its boot goes
# on: wait for it rather than start another), a suspended one resumes in about a
# millisecond, a stopped one has its image cached, a spare never started (created) was
# pulled at deploy; a failed one last: it may fail again, but left alone it would hold a
# max_machines slot (and its worker's reservation) forever.
REUSABLE_ORDER = ("starting", "suspended", "stopped", "created", "failed")
GONE = frozenset({"destroying", "destroyed"})


@dataclass(frozen=True)
class MachineState:
    """What the wake plan needs to know of one machine."""

    id: str
    worker: str
    state: str
    release: int = 0  # the app's release it was made for


@dataclass(frozen=True)
class WakePlan:
    reuse: tuple[MachineState, ...]
    new: int
    shortfall: str  # "" when the plan starts all that was asked


@dataclass(frozen=True)
class Stop:
    suspend: bool


@dataclass(frozen=True)
class Refuse:
    code: str
    message: str


def plan_wake(
    config: AppConfig,
    machines: Sequence[MachineState],
    live_workers: Collection[str],
    count: int,
    claimed: Collection[str] = (),
    placing: int = 0,
    region_workers: Collection[str] | None = None,
    demand: int | None = None,
) -> WakePlan:
    """Start up to `count` machines: reuse stopped ones on live workers first, then new.

    `live_workers`: every live worker, in any region (`max_machines` counts the app's
    machines everywhere); `region_workers`: the live workers of the region woken, the only
    ones whose machines are reused (None: all of `live_workers`).
    `claimed`: machines another wake is already starting (not reused twice; counted even
    when `machines` does not show them yet);
    `placing`: new machines other wakes are placing (an agent may have made and reported
    one already, before the wake placing it claims it: as many machines never started
    and unclaimed as are being placed are taken to be those, counted once, not reused;
    a spare taken so is only left for a later wake);
    `demand`: requests held or in flight for the app at every edge (None: start `count`):
    the wake starts what brings the machines up, or coming up, to `machines_for(demand)`.
    """
    here = live_workers if region_workers is None else region_workers
    unclaimed_new = sorted(m.id for m in existing_machines(machines, live_workers)
                           if m.state == "created" and m.id not in claimed)
    seen = min(placing, len(unclaimed_new))
    if seen:
        claimed, placing = {*claimed, *unclaimed_new[:seen]}, placing - seen
    # Machines claimed that the view does not show yet (just made, maybe by another
    # placement) exist all the same: they count like the ones being placed.
    placing += len(set(claimed) - {m.id for m in machines})
    present = existing_machines(machines, live_workers)
    # Busy elsewhere: started, claimed by another wake, or being placed. A starting machine
    # nobody claimed is this wake's to wait for, so it is reusable rather than busy.
    active = placing + sum(
        1 for m in present if m.state == "started" or m.id in claimed
    )
    if demand is not None:
        count = machines_for(config, demand) - active
    wanted = max(0, min(count, config.max_machines - active))
    reusable = sorted(
        (m for m in present
         if m.state in REUSABLE_ORDER and m.id not in claimed and m.worker in here
        and m.release == config.release),  # never an older release: the reconciler replaces it
        key=lambda m: (REUSABLE_ORDER.index(m.state), m.id),
    )
    reuse = tuple(reusable[:wanted])
    new = min(wanted - len(reuse), room_for_new(config, machines, live_workers, placing))
    shortfall = ""
    if len(reuse) + new < count:
        shortfall = (
            f"capped by max_machines={config.max_machines}: {active} active, "
            f"{len(present)} exist, starting {len(reuse) + new} of {count}"
        )
    return WakePlan(reuse=reuse, new=new, shortfall=shortfall)


def machines_for(config: AppConfig, demand: int) -> int:
    """Machines `demand` concurrent requests need at `soft_limit` each, within
    `max_machines` (the edge's rule, applied to every edge's requests at once)."""
    return min(config.max_machines, -(-max(0, demand) // config.concurrency.soft_limit))


def existing_machines(
    machines: Sequence[MachineState], live_workers: Collection[str]
) -> list[MachineState]:
    """The machines that count against `max_machines`: every one that is not gone, in
    any state, on a live worker."""
    return [m for m in machines if m.state not in GONE and m.worker in live_workers]


def room_for_new(
    config: AppConfig,
    machines: Sequence[MachineState],
    live_workers: Collection[str],
    placing: int = 0,
) -> int:
    """How many new machines `max_machines` still allows (0 or more): the app's existing
    machines and the `placing` ones being placed (that no agent reports yet) count."""
    return max(0, config.max_machines - len(existing_machines(machines, live_workers))
               - placing)


def decide_autostop(
    config: AppConfig, machines: Sequence[MachineState], machine_id: str
) -> Stop | Refuse:
    """Stop or suspend `machine_id` per `auto_stop`, never below `min_machines_running`."""
    if config.auto_stop == "off":
        return Refuse("auto_stop_off", f"app {config.name} has auto_stop off")
    target = next((m for m in machines if m.id == machine_id), None)
    if target is None:
        return Refuse("not_found", f"machine {machine_id} not found")
    if target.state != "started":
        return Refuse("not_started", f"machine {machine_id} is {target.state}")
    started = sum(1 for m in machines if m.state == "started")
    if started - 1 < config.min_machines_running:
        return Refuse(
            "min_machines_running",
            f"{started} started, min_machines_running={config.min_machines_running}",
        )
    return Stop(suspend=config.auto_stop == "suspend")


def deploy_shortfall(
    config: AppConfig, machines: Sequence[MachineState]
) -> tuple[int, int]:
    """(running machines to add, spares to add) so the app has its minimum and spares,
    within `max_machines`."""
    present = [m for m in machines if m.state not in GONE]
    running = sum(1 for m in present if m.state in ACTIVE)
    standby = sum(1 for m in present if m.state in REUSABLE_ORDER)
    room = max(0, config.max_machines - len(present))
    add_running = min(room, max(0, config.min_machines_running - running))
    add_spares = min(room - add_running, max(0, config.spares - standby))
    return add_running, add_spares


def wake_failure(failures: Sequence[str], pending: int) -> str:
    """The error code of a wake in which no machine became ready (see WAKE_ERRORS).

    `failures`: codes of the machines that ended (no_capacity | start_failed |
    image_unavailable); `pending`: machines still starting when the budget ran out.
    An image that cannot be had says most: no retry will start anything.
    """
    if "image_unavailable" in failures:
        return "image_unavailable"
    if pending:
        return "deadline"
    if "start_failed" in failures:
        return "start_failed"
    return "no_capacity"


# What placement's wake and reconcile rules read of a machine: the facts its agent's view
# (agent.api.MachineView) and its registry record (ground.registry.MachineRecord) share, so
# a wake plans from the records as they are.
Machine = MachineFacts


def states_of(machines: Sequence[Machine], config: AppConfig) -> list[MachineState]:
    return [MachineState(m.id, m.worker, m.state, machine_release(m, config))
            for m in machines]


def machine_release(machine: Machine, config: AppConfig) -> int:
    """The release a machine was made for (`ground.appconfig.release_of`)."""
    return release_of(machine.release, machine.image_digest, config)
