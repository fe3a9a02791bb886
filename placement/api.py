"""Wire types of placement's API: what the edge imports (wake) and what the public API
takes and answers. The OpenAPI document is generated from these (placement/openapi.py)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from agent.api import MachineView
from ground.appconfig import MAX_SECRETS, AppConfig, AppName, EnvName, RegionOrPrimary, Strategy
from ground.registry.types import WorkerFacts
from placement.core.releases import ReleaseStatus
from placement.core.secrets import MAX_SECRET_VALUE_BYTES

MAX_DEADLINE_MS = 3_600_000
MAX_DEMAND = 1_000_000
# An edge process's id in wake requests (random per process): whose demand it is.
EdgeId = Annotated[str, msgspec.Meta(pattern="^[a-z0-9-]{1,64}$")]


# A JSON object as sent (a merge patch of an app's fields) or made (an OpenAPI document):
# its values are JSON, each checked where it is read (`object`, not `Any`: unchecked use
# is a type error).
JsonObject = dict[str, object]


class WakeRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`POST /internal/apps/{app}/wake`: start `count` machines within `deadline_ms`.

    `deadline_ms` is the budget left, in milliseconds, measured from receipt.
    `region` "" means the app's primary region. With `demand` (requests the edge `edge`
    holds or forwards for the app), placement sizes the wake from every edge's demand
    instead of `count`: the app's machines, up or coming up, become
    ceil(total / soft_limit), within max_machines.
    """

    count: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 1
    deadline_ms: Annotated[int, msgspec.Meta(ge=1, le=MAX_DEADLINE_MS)] = 30_000
    region: RegionOrPrimary = ""
    demand: Annotated[int, msgspec.Meta(ge=0, le=MAX_DEMAND)] | None = None
    edge: EdgeId | None = None

    def __post_init__(self) -> None:
        if (self.demand is None) != (self.edge is None):
            raise ValueError("demand and edge go together")


class WokenMachine(msgspec.Struct, frozen=True):
    id: str
    address: str  # host:port, reachable now
    worker: str


class WakeTimings(msgspec.Struct, frozen=True):
    """Milliseconds spent, for Server-Timing: the slowest machine's figures."""

    place_ms: float = 0.0
    pull_ms: float = 0.0
    boot_ms: float = 0.0


class WakeResponse(msgspec.Struct, frozen=True):
    """200: at least one machine is ready. `shortfall` explains fewer than asked.
    `predicted_ms`: what the wake predicted (0: no prediction); `ready_ms`: when its
    first machine was ready; both from the wake's receipt, to measure the prediction."""

    machines: list[WokenMachine]
    timings: WakeTimings = WakeTimings()
    shortfall: str = ""
    predicted_ms: float = 0.0
    ready_ms: float = 0.0


# A wake's answer as a stream: an edge that sends `Accept: application/x-ndjson` may get
# 200 with one JSON line per event, tagged by "line", as soon as each is known — first a
# WakePrediction (once every machine's worker is decided, before any is ready), then
# exactly one WakeAnswer or WakeRefusal (what the plain answer's status and body would
# have been). A wake that ends before its prediction is made is answered plainly, as to
# any other client; so is every client that does not ask.
WAKE_STREAM_TYPE = "application/x-ndjson"


class WakePrediction(msgspec.Struct, frozen=True, tag="prediction", tag_field="line"):
    """When the wake's earliest machine is predicted ready, in ms from the wake's receipt
    (placement/core/predict.py says how); `machines`: how many are starting."""

    predicted_ms: float
    machines: int = 0


class WakeAnswer(msgspec.Struct, frozen=True, tag="answer", tag_field="line"):
    answer: WakeResponse


class WakeRefusal(msgspec.Struct, frozen=True, tag="error", tag_field="line"):
    """The wake failed after its prediction: the status and body the plain answer has."""

    status: int
    error: str
    message: str


WakeLine = WakePrediction | WakeAnswer | WakeRefusal


# Error bodies are {"error": code, "message": text}. Codes and statuses:
WAKE_ERRORS = {
    "not_found": 404,  # unknown app
    "no_capacity": 503,  # no worker accepted an offer (Retry-After set)
    "start_failed": 503,  # a machine was placed but did not become ready
    "image_unavailable": 424,  # the image cannot be resolved or pulled: retrying won't help
    "deadline": 504,  # the budget ran out first
}


class AutostopRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`POST /internal/apps/{app}/machines/{id}/autostop`: the edge saw it idle."""

    idle_s: Annotated[float, msgspec.Meta(ge=0, le=1e9)] = 0.0


class SuspectReport(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`POST /internal/workers/{worker}/suspect`: an edge could not connect to a machine
    there. `reporter` names the edge (two edges' reports are independent evidence)."""

    reporter: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    machine: Annotated[str, msgspec.Meta(max_length=64)] = ""
    address: Annotated[str, msgspec.Meta(max_length=300)] = ""
    error: Annotated[str, msgspec.Meta(max_length=300)] = ""


class SuspectAnswer(msgspec.Struct, frozen=True):
    """Whether placement now counts the worker as failed, and why."""

    worker: str
    failed: bool
    reason: str


# -- the public API ----------------------------------------------------------------------


class ErrorBody(msgspec.Struct, frozen=True, omit_defaults=True):
    """Every error answer. `field`: the config field a 422 is about; `holder`: the app
    holding a host name (409 host_taken), only when the caller may see that app."""

    error: str
    message: str
    field: str | None = None
    holder: str | None = None


class Release(msgspec.Struct, frozen=True):
    """One immutable release of an app: what its machines are made from. Only `status`
    and `reason` change, as its rollout goes (pending -> rolling -> complete | failed;
    a release rolled back from is rolled_back once the rollback's rollout completes)."""

    app: str
    version: int
    image: str
    image_digest: str
    config: AppConfig
    strategy: Strategy
    status: ReleaseStatus
    created_at: float
    reason: str = ""  # why it was made, failed or rolled back
    # the release that ran when this one was made (0: none, or a record older than this
    # field): a failed rollout goes back to it
    replaces: int = 0
    rollback_to: int = 0  # a rollback: the release whose machine fields it copies


class DeployRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`POST /v1/apps/{app}/deploy`: optionally changes of the app's fields (a JSON merge
    patch, as PATCH takes — stored with the deploy in one change, so it is one release),
    a new image reference, resolved now, and a strategy for this rollout (default: the
    app's `deploy.strategy`)."""

    image: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)] | None = None
    strategy: Strategy | None = None
    config: JsonObject | None = None


class DeployResult(msgspec.Struct, frozen=True):
    app: AppConfig
    machines: list[MachineView]  # machines the first reconcile pass made
    shortfall: str = ""
    release: Release | None = None  # the new release; None: nothing changed


class RollbackRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`POST /v1/apps/{app}/rollback`: a new release made from release `version`."""

    version: Annotated[int, msgspec.Meta(ge=1, le=2**53)]


class AppEvent(msgspec.Struct, frozen=True):
    """What the reconciler did to an app (or found), and why."""

    at: float
    action: str  # start | create | replace | destroy | fence | release
    reason: str
    machine: str = ""
    outcome: str = "ok"  # ok, or what went wrong


class CreateMachineRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    start: bool = True
    region: RegionOrPrimary = ""  # "": the app's primary region


class AppDeleted(msgspec.Struct, frozen=True):
    deleted: str
    machines: list[str]  # ids of the machines destroyed


class MachineWaited(msgspec.Struct, frozen=True):
    """A machine in the state waited for (the whole view, or id and state once destroyed)."""

    id: str
    state: str


class WorkerView(WorkerFacts, frozen=True, kw_only=True):
    """`GET /v1/workers`: a worker's facts as its last heartbeat said them, and placement's
    judgement of it."""

    layers: int
    layer_bytes: int
    updated_at: float
    healthy: bool
    failed: str = ""  # why placement counts it failed although it heartbeats ("": it does not)


class RankedWorker(msgspec.Struct, frozen=True):
    worker: str
    score: float
    terms: dict[str, float]


class FilteredWorker(msgspec.Struct, frozen=True):
    worker: str
    stage: str
    reason: str


class OfferView(msgspec.Struct, frozen=True):
    worker: str
    reply: str
    machine_id: str
    message: str


class DecisionView(msgspec.Struct, frozen=True):
    at: float
    app: str
    region: str
    outcome: str
    fleet: int
    considered: int
    ranked: list[RankedWorker]
    filtered: list[FilteredWorker]
    offers: list[OfferView]


class MachineLog(msgspec.Struct, frozen=True):
    """One machine's new log lines (stdout and stderr, as the machine wrote them)."""

    machine: str
    worker: str
    state: str
    lines: list[str]


class LogsAnswer(msgspec.Struct, frozen=True):
    """`GET /v1/apps/{app}/logs`: each machine's lines since `?cursor=` (from its tail
    without one); pass `cursor` back to follow. `unreachable`: machines whose worker
    did not answer (their lines come once it does)."""

    logs: list[MachineLog]
    cursor: str
    unreachable: list[str] = msgspec.field(default_factory=list)


class TokenRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`POST /v1/tokens`: an admin token, or one scoped to existing apps."""

    name: Annotated[str, msgspec.Meta(max_length=64, pattern=r"^[\x20-\x7e]*$")] = ""
    admin: bool = False
    apps: Annotated[list[AppName], msgspec.Meta(max_length=100)] = msgspec.field(
        default_factory=list)
    expires_in_s: Annotated[int, msgspec.Meta(ge=60, le=2 * 366 * 86_400)] | None = None


class TokenView(msgspec.Struct, frozen=True):
    id: str
    name: str
    admin: bool
    apps: list[str]
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None


class TokenCreated(msgspec.Struct, frozen=True):
    """The secret `token` is in this answer only; it is never shown again."""

    id: str
    token: str
    name: str
    admin: bool
    apps: list[str]
    created_at: float
    expires_at: float | None = None


class Health(msgspec.Struct, frozen=True):
    ok: bool


class Readiness(msgspec.Struct, frozen=True, omit_defaults=True):
    """`/readyz`: 200 when ready to serve; 503 with `reason` when not."""

    ready: bool
    reason: str = ""


class SecretsRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`POST /v1/apps/{app}/secrets`: set (or replace) `secrets`, remove `unset`; the whole
    change is one release. Names are env names, none of them `PORT`, `THAW_*` or a name of
    the app's plain env; values are never answered, logged or published."""

    secrets: Annotated[dict[EnvName, Annotated[str, msgspec.Meta(
        max_length=MAX_SECRET_VALUE_BYTES)]], msgspec.Meta(max_length=MAX_SECRETS)] = (
        msgspec.field(default_factory=dict))
    unset: Annotated[list[EnvName], msgspec.Meta(max_length=MAX_SECRETS)] = msgspec.field(
        default_factory=list)


class SecretView(msgspec.Struct, frozen=True):
    """A secret as shown: its name and a digest (keyed; never its value)."""

    name: str
    digest: str
    created_at: float  # unix seconds: when it was last set


class SecretsChanged(msgspec.Struct, frozen=True):
    app: str
    secrets: list[SecretView]
    release: int | None  # the release the change made (None: nothing changed)
