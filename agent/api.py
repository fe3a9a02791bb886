"""Wire types of the agent's internal HTTP API (the only agent module others import)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from agent.core.machine import MachineState
from agent.core.records import Guest as Guest  # (re-exported: part of the wire types)
from agent.core.records import Health as Health
from ground.registry.types import MachineFacts, WorkerFacts

Text = Annotated[str, msgspec.Meta(max_length=1024)]
# what `MachineView.state` may be (the agent's machine states, agent/core/machine.py)
MACHINE_STATES = tuple(state.value for state in MachineState)
MAX_SEALED_CHARS = 512 * 1024  # 64 KiB of secrets as JSON (escapes), encrypted, base64


class OfferRequest(msgspec.Struct, frozen=True):
    """`POST /v1/offers`. The key makes the offer idempotent."""

    key: Annotated[str, msgspec.Meta(max_length=256)]
    app: Annotated[str, msgspec.Meta(max_length=64)]
    image: Text
    guest: Guest = Guest()
    # bounded as an app's env is (ground.appconfig): a machine's record stays small
    env: Annotated[dict[Text, str], msgspec.Meta(max_length=128)] = msgspec.field(
        default_factory=dict)
    health: Health = Health()
    kill_signal: Annotated[str, msgspec.Meta(max_length=16)] = ""  # "": the image's
    kill_timeout_s: float = 5.0
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 0  # 0: the image's, else 8080
    entrypoint: Annotated[list[Text], msgspec.Meta(max_length=256)] = msgspec.field(
        default_factory=list)
    cmd: Annotated[list[Text], msgspec.Meta(max_length=256)] = msgspec.field(
        default_factory=list)
    start: bool = True
    app_uid: Annotated[str, msgspec.Meta(max_length=64)] = ""  # the app's incarnation
    spare: bool = False  # a standby not to start now: accepted without room to run it
    # made by the reconciler to keep the app's `spares` (trimmed when spares is lowered);
    # a standby a wake or `POST .../machines {start: false}` made is not
    for_spares: bool = False
    release: Annotated[int, msgspec.Meta(ge=0, le=2**53)] = 0  # the app's release it runs
    # the app's secrets, sealed by placement with the cluster key (ground/auth/sealing.py):
    # kept so in the op log, opened only to build the machine's environment at a start
    sealed_env: Annotated[str, msgspec.Meta(max_length=MAX_SEALED_CHARS)] = ""
    # the machine's id, chosen by placement ("": the agent makes one), and its route ticket
    # for this worker (ground/auth/tickets.py; "": its records are not sealed)
    id: Annotated[str, msgspec.Meta(pattern="^([0-9a-f]{8,32})?$")] = ""
    ticket: Annotated[str, msgspec.Meta(max_length=64, pattern="^[A-Za-z0-9_-]*$")] = ""


class EventView(msgspec.Struct, frozen=True):
    state: str
    event: str
    at: float
    reason: str = ""


class MachineView(MachineFacts, frozen=True, kw_only=True):
    """A machine as its agent answers: its facts, and what it was asked to run."""

    image: str
    pid: int
    guest: Guest
    events: list[EventView]
    for_spares: bool = False  # made to keep the app's spares (see Offer)
    # its route seal over these facts, as its registry record carries it ("": unsealed):
    # an edge that asked this agent to thaw the machine routes by the answer only if it
    # verifies (ground/auth/tickets.py), as it would the record
    seal: str = ""


class PullRequest(msgspec.Struct, frozen=True):
    ref: str


class MachineGone(msgspec.Struct, frozen=True):
    """`GET /v1/machines/{id}/wait?state=destroyed`'s answer once the machine is gone (no
    view is left to send)."""

    id: str
    state: str


class PulledLayer(msgspec.Struct, frozen=True):
    digest: str  # "sha256:<hex>" of the compressed blob
    size: int


class PulledImage(msgspec.Struct, frozen=True):
    """`POST /v1/images/pull`'s answer as a caller reads it (the agent sends the whole
    `imagecache.api.Image`; its config and rootfs are the worker's own business)."""

    ref: str
    digest: str
    layers: list[PulledLayer]


class HealthView(msgspec.Struct, frozen=True, omit_defaults=True):
    """`GET /healthz`: the agent's process answers, under `epoch` (its op log's
    incarnation); `ok` false (503) when its op log cannot be written."""

    ok: bool
    epoch: int = -1
    error: str = ""
    message: str = ""


class ErrorView(msgspec.Struct, frozen=True):
    """Every refusal the agent answers: a code (`no_capacity`, `stale_fence`, `timeout`,
    `not_found`, ...) and a message."""

    error: str = "agent_error"
    message: str = ""


class StatusView(WorkerFacts, frozen=True, kw_only=True):
    """`GET /v1/status`: the worker's facts as its heartbeat says them (`disk_full`: offers
    and starts get 503), what runs its machines and what its image cache holds."""

    machine_states: dict[str, int]  # state -> count
    driver: str  # what runs machines: oci/runc, bubblewrap, process
    isolated: bool  # machines are a boundary between tenants (own userland, network, limits)
    layers: int
    layer_bytes: int
