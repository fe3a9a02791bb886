"""Wire types of the registry, shared by every service (JSON via msgspec)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import msgspec


class MachineEvent(msgspec.Struct, frozen=True):
    """One state transition: `at` is unix seconds."""

    state: str
    at: float
    reason: str = ""


class PlacementAdvert(msgspec.Struct, frozen=True):
    """A placement's API URL, for edges to wake through (published with a TTL). `seal`:
    HMAC of id and URL under the route key (ground/auth/tickets.py advert_seal): anyone who
    may write Redis can write an advert, only placements can seal one."""

    id: str
    url: str
    seal: str = ""


class WorkerFacts(msgspec.Struct, frozen=True):
    """What every view of a worker says, named once: who it is (`epoch`, a fencing token
    that grows on every agent start), where it answers, its size and what is reserved of
    it, its machines, and whether it takes changes and pulls now. The heartbeat
    (`WorkerStatus`), the agent's `/v1/status` (`agent.api.StatusView`) and placement's
    `/v1/workers` (`placement.api.WorkerView`) are each these facts plus their own."""

    id: str
    epoch: int
    region: str
    url: str
    cpus: float
    memory_mb: int
    reserved_cpus: float = 0.0
    reserved_memory_mb: int = 0
    machines_starting: int = 0
    machines_running: int = 0  # starting or started (what the reservations are for)
    machines: int = 0  # that exist, in any state
    draining: bool = False
    disk_full: bool = False  # its op log could not be written: it takes no changes now
    # why it cannot pull an image now ("" when it can): its free disk, even with what its
    # image cache may evict gone, is below the cache's reserve. It still takes machines
    # whose image's layers it holds.
    pull_blocked: str = ""


def facts_of(view: WorkerFacts | MachineFacts) -> dict[str, Any]:
    """The facts of `view` (a worker's or a machine's) as keywords, to build another view
    of the same worker or machine from."""
    kind = WorkerFacts if isinstance(view, WorkerFacts) else MachineFacts
    return {name: getattr(view, name) for name in kind.__struct_fields__}


class WorkerStatus(WorkerFacts, frozen=True):
    """A worker's heartbeat: its facts, the layers it holds and what placement needs to
    predict a pull and to know a registry loss is refilled."""

    layers: dict[str, int] = msgspec.field(default_factory=dict)  # digest -> bytes
    updated_at: float = 0.0
    # Its whole pulls' measured rate, bytes downloaded over resolve-to-unpacked seconds
    # (an EWMA over pulls that downloaded enough to say; 0: none measured yet). Older
    # agents do not send it: placement then assumes its documented default.
    pull_bytes_per_s: float = 0.0
    # The registry generation under which every record of this worker (its layers and
    # machines) is published ("" until its first full publish, or from an older agent):
    # after a loss, placement waits for it to name the new one before acting.
    generation: str = ""


def boot_span_ms(events: Iterable[tuple[str, float]]) -> float:
    """From a machine's (state, unix seconds) events: the last `starting` to the `started`
    after it, in ms (0 when it has not started since it last began starting)."""
    started_at = starting_at = None
    for state, at in events:
        if state == "starting":
            starting_at, started_at = at, None
        elif state == "started" and starting_at is not None:
            started_at = at
    if starting_at is None or started_at is None:
        return 0.0
    return max(0.0, float(started_at - starting_at) * 1000)


class MachineFacts(msgspec.Struct, frozen=True):
    """What every view of a machine says, named once: which app (and incarnation,
    `app_uid`; release) it is for, where it runs and answers, its state and image. The
    registry's copy (`MachineRecord`) and the agent's answer (`agent.api.MachineView`) are
    each these facts plus their own."""

    id: str
    app: str
    worker: str
    region: str
    state: str
    image_digest: str
    created_at: float
    updated_at: float
    address: str = ""  # host:port, while started or suspended (routed to only started)
    app_uid: str = ""  # the incarnation of the app (AppConfig.uid) the machine belongs to
    release: int = 0  # the app's release the machine was made for


class MachineRecord(MachineFacts, frozen=True):
    """The registry's copy of a machine; the worker that runs it holds the truth."""

    epoch: int = 0
    events: list[MachineEvent] = msgspec.field(default_factory=list)
    # its route seal (ground/auth/tickets.py): made with the ticket placement gave the
    # machine's worker, over state, address and updated_at ("": unsealed)
    seal: str = ""


# The two change feeds: what edges route by (apps, machines, the republished marker),
# and the workers' own (heartbeats, layer sets), which only placement follows: a
# worker's heartbeat a second is no read for every edge.
Feed = Literal["routes", "workers"]
ROUTES: Feed = "routes"
WORKERS: Feed = "workers"
WORKER_KINDS = ("worker", "layers")  # the kinds of change on the workers' feed


def feed_of(kind: str) -> Feed:
    return WORKERS if kind in WORKER_KINDS else ROUTES


class Change(msgspec.Struct, frozen=True):
    """One entry of a change feed. `kind` is machine|app|republished on the routes feed,
    worker|layers on the workers'; `seq` is opaque."""

    seq: str
    kind: str
    key: str
