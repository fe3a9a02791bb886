"""Wire types of the agent's internal HTTP API (the only agent module others import)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from agent.core.machine import MachineState
from agent.core.records import Guest as Guest  # (re-exported: part of the wire types)
from agent.core.records import Health as Health

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


class MachineView(msgspec.Struct, frozen=True):
    id: str
    app: str
    worker: str
    region: str
    state: str
    image: str
    image_digest: str
    address: str
    pid: int
    created_at: float
    updated_at: float
    guest: Guest
    events: list[EventView]
    app_uid: str = ""  # the incarnation of the app it belongs to
    release: int = 0  # the app's release it was made for
    for_spares: bool = False  # made to keep the app's spares (see Offer)


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


class StatusView(msgspec.Struct, frozen=True):
    id: str
    epoch: int
    region: str
    url: str
    cpus: float
    memory_mb: int
    reserved_cpus: float
    reserved_memory_mb: int
    machines: dict[str, int]  # state -> count
    driver: str  # what runs machines: oci/runc, bubblewrap, process
    isolated: bool  # machines are a boundary between tenants (own userland, network, limits)
    layers: int
    layer_bytes: int
    disk_full: bool = False  # the op log cannot be written now: offers and starts get 503
    pull_blocked: str = ""  # why no image can be pulled now (disk below the cache's reserve)
