"""Wire types of the agent's internal HTTP API (the only agent module others import)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from agent.core.records import Guest, Health

Text = Annotated[str, msgspec.Meta(max_length=1024)]
MAX_SEALED_CHARS = 512 * 1024  # 64 KiB of secrets as JSON (escapes), encrypted, base64


class OfferRequest(msgspec.Struct, frozen=True):
    """`POST /v1/offers`. The key makes the offer idempotent."""

    key: Annotated[str, msgspec.Meta(max_length=256)]
    app: Annotated[str, msgspec.Meta(max_length=64)]
    image: Text
    guest: Guest = Guest()
    # bounded as an app's env is (thaw.appconfig): a machine's record stays small
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
    release: Annotated[int, msgspec.Meta(ge=0, le=2**53)] = 0  # the app's release it runs
    # the app's secrets, sealed by placement with the cluster key (thaw/auth/sealing.py):
    # kept so in the op log, opened only to build the machine's environment at a start
    sealed_env: Annotated[str, msgspec.Meta(max_length=MAX_SEALED_CHARS)] = ""
    # the machine's id, chosen by placement ("": the agent makes one), and its route ticket
    # for this worker (thaw/auth/tickets.py; "": its records are not sealed)
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


class PullRequest(msgspec.Struct, frozen=True):
    ref: str


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
