"""Op log records: every change of the agent's state is one of these, written first.

The agent's state is a pure replay of these records (see `state.py`). Records
are facts or intents the agent persisted *before* acting; they never refer to
live objects. Only add kinds and optional fields: old logs must keep replaying.
"""

from __future__ import annotations

from typing import Literal

import msgspec


class Guest(msgspec.Struct, frozen=True):
    cpus: float = 1.0
    memory_mb: int = 256


class Health(msgspec.Struct, frozen=True):
    """Readiness check: TCP connect when `path` is empty, else a GET of `path` — over
    HTTP/1.1, or over HTTP/2 with prior knowledge when the app's `protocol` is "h2c"
    (where /grpc.health.v1.Health/Check is the gRPC health protocol's call)."""

    path: str = ""
    timeout_s: float = 30.0
    protocol: Literal["http1", "h2c"] = "http1"


class MachineSpec(msgspec.Struct, frozen=True):
    app: str
    image: str  # reference as given
    guest: Guest = Guest()
    env: dict[str, str] = msgspec.field(default_factory=dict)
    health: Health = Health()
    kill_signal: str = "SIGTERM"  # "": the image's StopSignal, else SIGTERM
    kill_timeout_s: float = 5.0
    # The incarnation of the app (placement's AppConfig.uid): a machine is an app's only
    # while they match, so a new app of a deleted one's name never takes its machines.
    app_uid: str = ""
    release: int = 0  # the app's release (placement's) the machine was made for
    port: int = 0  # the port the app listens on; 0: the image's one ExposedPort, else 8080
    # Overrides of the image's Entrypoint and Cmd (as Kubernetes' command and args: a new
    # entrypoint drops the image's Cmd unless `cmd` is given too); empty: the image's.
    entrypoint: list[str] = msgspec.field(default_factory=list)
    cmd: list[str] = msgspec.field(default_factory=list)
    sealed_env: str = ""  # the app's secrets, sealed (ground/auth/sealing.py); never in clear
    # placement's route ticket for this machine on this worker (ground/auth/tickets.py): a
    # secret that seals the machine's registry records; never published
    ticket: str = ""
    for_spares: bool = False  # made by placement's reconciler to keep the app's spares


class Boot(msgspec.Struct, frozen=True, tag="boot"):
    """The agent started; `epoch` fences its registrations (grows by one per start)."""

    epoch: int
    at: float


class Created(msgspec.Struct, frozen=True, tag="created"):
    id: str
    spec: MachineSpec
    offer_key: str
    at: float


class Transition(msgspec.Struct, frozen=True, tag="transition"):
    """Intent or fact of a state change (state after the event)."""

    id: str
    event: str
    state: str
    at: float
    reason: str = ""


class ImageResolved(msgspec.Struct, frozen=True, tag="image"):
    id: str
    digest: str
    at: float


class Launched(msgspec.Struct, frozen=True, tag="launched"):
    """A process now runs the machine; pid + start_time identify it across agent restarts.
    The edge dials host:port ("" host: the agent's machine host, as before containers)."""

    id: str
    pid: int
    start_time: int
    port: int
    at: float
    runtime_id: str = ""  # the runtime's name for the machine's container ("": a process)
    host: str = ""


class Gone(msgspec.Struct, frozen=True, tag="gone"):
    """The machine's process is known to be gone; `reason` says how it ended when that is
    known (agent.core.exits: exited(N), signalled(SIG), oom, exited(?))."""

    id: str
    at: float
    reason: str = ""


class Fenced(msgspec.Struct, frozen=True, tag="fence"):
    """The highest fencing token a placement acted on `app` under (its reconcile lease's):
    a call under a lower one comes from a holder whose lease has passed to another."""

    app: str
    token: int
    at: float


Record = Boot | Created | Transition | ImageResolved | Launched | Gone | Fenced
